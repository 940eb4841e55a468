#include "net/ucx/ucx_worker.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/step_trace.h"
#include "net/ucx/ucx_connection.h"

namespace hoplite {

std::string ucxError(const char* what, ucs_status_t status) {
  return std::string(what) + ": " + ucs_status_string(status);
}

namespace {

// ucp_worker_progress calls in one turn of the loop before its other work
// (posted calls, timers, other sockets) gets a turn.
constexpr int kCallsPerTurn = 64;
// How soon a worker whose arm stayed busy through a turn without events is
// progressed again.
constexpr double kBusyArmRetrySeconds = 0.001;

// What UCX_TLS asks for: unset (or "all"), every transport UCX has; "^a,b",
// all but those; "a,b", those alone.
class TlsChoice {
 public:
  explicit TlsChoice(const char* env) {
    std::string_view rest = env == nullptr ? std::string_view() : std::string_view(env);
    if (!rest.empty() && rest.front() == '^') {
      excluding_ = true;
      rest.remove_prefix(1);
    }
    while (!rest.empty()) {
      const size_t comma = rest.find(',');
      items_.emplace_back(rest.substr(0, comma));
      rest.remove_prefix(comma == std::string_view::npos ? rest.size() : comma + 1);
    }
  }
  // One of `transports` may carry traffic.
  bool allows(std::initializer_list<std::string_view> transports) const {
    if (excluding_) return !listsAny(transports);
    return items_.empty() || listsAny({"all"}) || listsAny(transports);
  }
  // One of `transports` is asked for by name, not merely left in.
  bool names(std::initializer_list<std::string_view> transports) const {
    return !excluding_ && listsAny(transports);
  }

 private:
  bool listsAny(std::initializer_list<std::string_view> transports) const {
    for (const std::string& item : items_) {
      for (std::string_view transport : transports) {
        if (item == transport) return true;
      }
    }
    return false;
  }
  bool excluding_ = false;
  std::vector<std::string> items_;
};

// Sets a UCX setting unless the user set one of `userVariables`.
void setUnlessUserSet(ucp_config_t* config, const char* key, const char* value,
                      std::initializer_list<const char*> userVariables) {
  for (const char* variable : userVariables) {
    if (std::getenv(variable) != nullptr) return;
  }
  const ucs_status_t s = ucp_config_modify(config, key, value);
  if (s != UCS_OK) HLOG(kWarn, "UCX: could not set %s=%s: %s", key, value, ucs_status_string(s));
}

void check(ucs_status_t status, const char* what) {
  if (status != UCS_OK) throw std::runtime_error(ucxError(what, status));
}

}  // namespace

UcxWorker::UcxWorker(EventLoop& loop, const TransportOptions& options)
    : loop_(loop),
      options_(options),
      ids_(std::random_device{}()),
      amRoutes_{{{this, kUcxControlAm}, {this, kUcxDataAm}, {this, kUcxEndAm}}} {
  ucp_config_t* config = nullptr;
  check(ucp_config_read(nullptr, nullptr, &config), "UCX: reading its configuration (UCX_* variables)");
  // UCX's tcp sends in segments of 8 KiB and receives in 64 KiB by default:
  // on a 16-core host that held a pull to a third of our TCP's rate. Larger
  // sends help there but cost over 1 Gbit/s links (64 KiB: a 16 MB broadcast
  // 29% slower; 1 MiB: a 256 MB allreduce 14%); benchmarks/README.md, "UCX".
  // (Set only where tcp may be used: UCX warns of settings nothing took.)
  const TlsChoice tls(std::getenv("UCX_TLS"));
  if (tls.allows({"tcp"})) {
    setUnlessUserSet(config, "TX_SEG_SIZE", "32k", {"UCX_TCP_TX_SEG_SIZE"});
    setUnlessUserSet(config, "RX_SEG_SIZE", "256k", {"UCX_TCP_RX_SEG_SIZE"});
  }
  // Every endpoint reports its peer's failure, and UCX's shared-memory
  // transports take part in that only if told to expose error handling
  // (off by default): then a dead peer is found by UCX's keepalive, which
  // checks that the peer's process still exists. Every 1 s instead of UCX's
  // 20, as TCP learns of a dead peer's closed socket at once. Shared memory
  // is used when UCX_TLS names it; left to choose, UCX would take it over tcp
  // for peers on one host, slower for 1 MB objects (benchmarks/README.md, "UCX").
  if (tls.names({"sm", "shm", "mm", "posix", "sysv", "xpmem"})) {
    setUnlessUserSet(config, "MM_ERROR_HANDLING", "y",
                     {"UCX_MM_ERROR_HANDLING", "UCX_POSIX_ERROR_HANDLING", "UCX_SYSV_ERROR_HANDLING",
                      "UCX_XPMEM_ERROR_HANDLING"});
    setUnlessUserSet(config, "KEEPALIVE_INTERVAL", "1s", {"UCX_KEEPALIVE_INTERVAL"});
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  params.name = "hoplite";
  const ucs_status_t initStatus = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  check(initStatus, "UCX: ucp_init");

  ucp_worker_params_t workerParams{};
  workerParams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Made on the node's constructing thread, then used only by its loop thread.
  workerParams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t status = ucp_worker_create(context_, &workerParams, &worker_);
  if (status == UCS_OK) status = ucp_worker_get_efd(worker_, &eventFd_);
  for (AmRoute& route : amRoutes_) {
    if (status != UCS_OK) break;
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                         UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
    handler.id = route.id;
    // Eager payloads stay in UCX's buffers until handed over in order (no copy).
    handler.flags = UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA;
    handler.cb = &UcxWorker::onAm;
    handler.arg = &route;
    status = ucp_worker_set_am_recv_handler(worker_, &handler);
  }
  if (status == UCS_OK) {
    ucp_address_t* address = nullptr;
    size_t size = 0;
    status = ucp_worker_get_address(worker_, &address, &size);
    if (status == UCS_OK) {
      address_.assign(reinterpret_cast<const char*>(address), size);
      ucp_worker_release_address(worker_, address);
    }
  }
  if (status != UCS_OK) {
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    throw std::runtime_error(ucxError("UCX: setting up the worker", status));
  }
}

UcxWorker::~UcxWorker() { shutdown(); }

void UcxWorker::shutdown() {
  if (worker_ == nullptr) return;
  stopping_ = true;
  auto connections = std::move(connections_);
  endpoints_.clear();
  for (auto& [id, weak] : connections) {
    if (auto conn = weak.lock()) conn->abort();
  }
  ready_.clear();
  // Cancelled operations complete (their callbacks see closed connections),
  // and the closes finish, bounded: a close waits on nothing remote.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  bool idle = false;
  do {
    idle = progressQuietly();
    reapClosed();
  } while ((!idle || !closing_.empty()) && std::chrono::steady_clock::now() < deadline);
  if (!closing_.empty()) HLOG(kWarn, "UCX: %zu endpoint closes did not finish", closing_.size());
  if (eventFd_ >= 0) loop_.removeFd(eventFd_);
  eventFd_ = -1;
  ucp_worker_destroy(worker_);
  worker_ = nullptr;
  ucp_cleanup(context_);
  context_ = nullptr;
}

void UcxWorker::open() {
  loop_.addFd(eventFd_, EPOLLIN, this);
  // The worker must be progressed once before it can be armed.
  std::weak_ptr<UcxWorker> weak = shared_from_this();
  loop_.post([weak] {
    if (auto self = weak.lock()) self->progress();
  });
}

void UcxWorker::handleEvents(uint32_t) { progress(); }

void UcxWorker::progressSoon() {
  if (progressQueued_ || stopping_) return;
  progressQueued_ = true;
  loop_.runSoon([self = shared_from_this()] {
    self->progressQueued_ = false;
    self->progress();
  });
}

unsigned UcxWorker::progressOnce() {
  const bool outer = !insideProgress_;
  insideProgress_ = true;
  const unsigned events = ucp_worker_progress(worker_);
  if (!outer) return events;
  insideProgress_ = false;
  for (ucp_ep_h ep : std::exchange(toClose_, {})) closeEndpoint(ep);
  return events;
}

bool UcxWorker::progressQuietly() {
  for (int calls = 0; calls < kCallsPerTurn; ++calls) {
    if (progressOnce() == 0) return true;
  }
  return false;
}

void UcxWorker::progress() {
  if (progressing_ || stopping_) return;  // a pass is under way further up this stack: it goes on
  progressing_ = true;
  traceStep(Step::kUcxProgress, std::string());
  // Frames are handed over between calls, not once UCX has nothing left: a
  // rendezvous starts only when its frame is delivered, and a stream of them
  // keeps ucp_worker_progress busy until the window drains.
  int calls = 0;
  bool worked = false;
  for (;;) {
    while (calls < kCallsPerTurn) {
      ++calls;
      if (progressOnce() == 0) break;
      worked = true;
      deliver();
    }
    reapClosed();
    deliver();
    if (calls >= kCallsPerTurn) {
      resumeLater(worked);
      break;
    }
    // Busy: events came in since the last call; progress again before sleeping.
    if (ucp_worker_arm(worker_) != UCS_ERR_BUSY) break;
  }
  progressing_ = false;
}

void UcxWorker::resumeLater(bool streaming) {
  if (resumeQueued_ || stopping_) return;
  resumeQueued_ = true;
  auto resume = [weak = weak_from_this()] {
    if (auto self = weak.lock()) {
      self->resumeQueued_ = false;
      self->progress();
    }
  };
  // A stream: the loop's timers and other sockets go first, then more of it.
  // An arm that stays busy with nothing to do (UCX 1.13 retries a keepalive
  // to a stopped shared-memory peer at every call): asked again shortly,
  // not spun on.
  if (streaming) {
    loop_.post(std::move(resume));
  } else {
    loop_.addTimer(kBusyArmRetrySeconds, std::move(resume));
  }
}

void UcxWorker::closeEndpoint(ucp_ep_h ep) {
  if (insideProgress_) {
    toClose_.push_back(ep);
    return;
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t request = ucp_ep_close_nbx(ep, &param);
  if (UCS_PTR_IS_PTR(request)) closing_.push_back(request);
}

void UcxWorker::reapClosed() {
  std::erase_if(closing_, [](void* request) {
    if (ucp_request_check_status(request) == UCS_INPROGRESS) return false;
    ucp_request_free(request);
    return true;
  });
}

void UcxWorker::deliver() {
  while (!ready_.empty()) {
    std::vector<std::shared_ptr<UcxConnection>> ready;
    ready.swap(ready_);
    for (auto& conn : ready) conn->deliver();
  }
}

uint64_t UcxWorker::newConnectionId() {
  uint64_t id;
  do {
    id = ids_();
  } while (id == 0 || connections_.count(id) != 0);
  return id;
}

void UcxWorker::add(uint64_t id, ucp_ep_h ep, const std::shared_ptr<UcxConnection>& conn) {
  if (stopping_) return;
  connections_[id] = conn;
  endpoints_[ep] = id;
}

void UcxWorker::remove(uint64_t id, ucp_ep_h ep) {
  connections_.erase(id);
  endpoints_.erase(ep);
}

void UcxWorker::markReady(const std::shared_ptr<UcxConnection>& conn) {
  if (!stopping_) ready_.push_back(conn);
}

UcxConnection* UcxWorker::connectionOf(uint64_t id) {
  auto it = connections_.find(id);
  if (it == connections_.end()) return nullptr;
  auto conn = it->second.lock();
  return conn.get();  // the ready list or the owner keeps it alive past this pass
}

ucs_status_t UcxWorker::onAm(void* arg, const void* header, size_t headerSize, void* data, size_t size,
                             const ucp_am_recv_param_t* param) {
  const auto* route = static_cast<const AmRoute*>(arg);
  uint64_t id = 0;
  if (headerSize >= kUcxIdSize) std::memcpy(&id, header, kUcxIdSize);
  UcxConnection* conn = route->worker->connectionOf(id);
  if (conn == nullptr) return UCS_OK;  // its connection is closed (or never was): dropped
  return conn->onAm(route->id, static_cast<const uint8_t*>(header) + kUcxIdSize, headerSize - kUcxIdSize, data, size,
                    param);
}

void UcxWorker::onEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  // UCX calls this from its own async thread too (seen with its connection
  // manager): the loop thread takes it from here.
  auto* self = static_cast<UcxWorker*>(arg);
  self->loop_.post([weak = self->weak_from_this(), ep, status] {
    auto worker = weak.lock();
    if (!worker || worker->stopping_) return;
    auto it = worker->endpoints_.find(ep);
    if (it == worker->endpoints_.end()) return;
    if (auto conn = worker->connectionOf(it->second)) conn->onEndpointError(status);
  });
}

}  // namespace hoplite
