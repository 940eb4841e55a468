// The "ucx" transport: UCP active messages over whatever fabrics UCX finds
// (UCX_TLS chooses: RDMA, shared memory, TCP, CUDA), built into its own
// shared object that registers itself when the node first asks for it.
// Workers meet through a TCP bootstrap at the node's listening address
// (bootstrap.h), then talk over endpoints made from each other's addresses.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/logging.h"
#include "net/sockets.h"
#include "net/transport_registry.h"
#include "net/ucx/bootstrap.h"
#include "net/ucx/ucx_connection.h"
#include "net/ucx/ucx_worker.h"

namespace hoplite {
namespace {

// Long enough for a loaded peer; a stranger that says nothing is dropped then.
constexpr double kHelloTimeoutSeconds = 10.0;

using RefusedCount = std::shared_ptr<std::atomic<uint64_t>>;

BootstrapKey keyOf(const UcxWorker& worker) { return {worker.options().secret, worker.options().clusterId}; }

// An endpoint to the worker whose address the peer's hello gave, with peer
// error handling: a peer that dies or closes is reported, not waited for.
ucs_status_t endpointTo(UcxWorker& worker, const std::string& address, ucp_ep_h* ep) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxWorker::onEndpointError;
  params.err_handler.arg = &worker;
  return ucp_ep_create(worker.handle(), &params, ep);
}

// The endpoint to the worker the peer's hello names, with `conn` attached to
// it; why not otherwise (an empty address: the peer cannot reach this worker).
Status attachTo(UcxWorker& worker, UcxConnection& conn, const BootstrapHello& hello, const std::string& where) {
  if (hello.workerAddress.empty()) return Status(Code::kPeerFailed, "UCX at " + where + " could not reach this worker");
  ucp_ep_h ep = nullptr;
  const ucs_status_t status = endpointTo(worker, hello.workerAddress, &ep);
  if (status != UCS_OK) return Status(Code::kPeerFailed, ucxError(("UCX: endpoint to " + where).c_str(), status));
  conn.attach(ep, hello.connectionId);
  return {};
}

class UcxListener : public Listener {
 public:
  UcxListener(std::shared_ptr<UcxWorker> worker, const std::string& host, int port, ConnectionObserver* observer,
              AcceptCallback onAccept, RefusedCount refused)
      : worker_(std::move(worker)),
        refused_(std::move(refused)),
        host_(host),
        observer_(observer),
        onAccept_(std::move(onAccept)),
        acceptor_(worker_->loop(), host, port, [this](int fd, const std::string& peer) { respond(fd, peer); }) {}

  std::string host() const override { return host_; }
  int port() const override { return acceptor_.port(); }
  void close() override { acceptor_.close(); }

 private:
  // The peer's proven hello first: the connection and its endpoint exist, and
  // take messages, before this side's hello tells the peer it may send.
  void respond(int fd, const std::string& peer) {
    auto conn = std::make_shared<UcxConnection>(worker_, peer, observer_);
    auto reply = [worker = worker_, conn, peer](const BootstrapHello& hello) {
      const Status attached = attachTo(*worker, *conn, hello, peer);
      if (!attached.ok()) {
        HLOG(kWarn, "%s", attached.message.c_str());
        return BootstrapHello{};  // an empty hello: the peer gives up
      }
      return BootstrapHello{conn->localId(), worker->address()};
    };
    auto done = [conn, onAccept = onAccept_, refused = refused_](const Status& why, const BootstrapHello&,
                                                                  bool wrongProof) {
      if (why.ok() && conn->wasEstablished()) {
        onAccept(conn);
        return;
      }
      if (wrongProof) {
        ++*refused;
        HLOG(kWarn, "%s", why.message.c_str());
      }
      conn->abort();  // never handed to the node: nobody to tell
    };
    BootstrapExchange::respond(worker_->loop(), fd, peer, keyOf(*worker_), std::move(reply), kHelloTimeoutSeconds,
                               std::move(done));
  }

  std::shared_ptr<UcxWorker> worker_;
  RefusedCount refused_;
  std::string host_;
  ConnectionObserver* observer_;
  AcceptCallback onAccept_;
  SocketAcceptor acceptor_;  // last: its handler uses the members above
};

class UcxTransport : public Transport {
 public:
  UcxTransport(EventLoop& loop, const TransportOptions& options) {
    if (!options.congestion.empty()) {
      throw std::invalid_argument("tcp_congestion applies to the tcp transport, not to ucx");
    }
    worker_ = std::make_shared<UcxWorker>(loop, options);
    worker_->open();
  }
  // After the node's loop has stopped: nothing of UCX may outlive the node.
  ~UcxTransport() override { worker_->shutdown(); }

  std::unique_ptr<Listener> listen(const std::string& host, int port, ConnectionObserver* observer,
                                   AcceptCallback onAccept) override {
    return std::make_unique<UcxListener>(worker_, host, port, observer, std::move(onAccept), refused_);
  }

  // Must be called on the loop thread.
  std::shared_ptr<Connection> connect(const std::string& host, int port, ConnectionObserver* observer) override {
    const sockaddr_in addr = makeAddress(host, port);
    const std::string where = addressString(addr);
    auto conn = std::make_shared<UcxConnection>(worker_, where, observer);
    int err = 0;
    const int fd = connectingSocket(addr, nullptr, &err);
    if (err != 0) {
      ::close(fd);
      // Reported from the loop, after the caller has stored the connection.
      Status why(Code::kPeerFailed, "connect to " + where + ": " + std::strerror(err));
      worker_->loop().post([conn, why] { conn->close(why); });
      return conn;
    }
    auto done = [worker = worker_, conn, where, refused = refused_](const Status& why, const BootstrapHello& hello,
                                                                     bool wrongProof) {
      if (wrongProof) ++*refused;
      if (!conn->isOpen()) return;  // closed meanwhile
      // The node dials again only if the peer was never reached.
      const Status attached = why.ok() ? attachTo(*worker, *conn, hello, where) : why;
      if (!attached.ok()) conn->close(attached);
    };
    BootstrapExchange::dial(worker_->loop(), fd, where, keyOf(*worker_),
                            BootstrapHello{conn->localId(), worker_->address()}, kHelloTimeoutSeconds,
                            [conn] { conn->markReached(); }, std::move(done));
    return conn;
  }

  uint64_t peersRefused() const override { return *refused_; }

 private:
  std::shared_ptr<UcxWorker> worker_;
  RefusedCount refused_ = std::make_shared<std::atomic<uint64_t>>(0);
};

[[maybe_unused]] const bool kRegistered = registerTransport("ucx", [](EventLoop& loop, const TransportOptions& options) {
  return std::make_unique<UcxTransport>(loop, options);
});

}  // namespace
}  // namespace hoplite
