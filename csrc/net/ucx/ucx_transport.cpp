// The "ucx" transport: UCP active messages over whatever fabrics UCX finds
// (UCX_TLS chooses: RDMA, shared memory, TCP, CUDA), built into its own
// shared object that registers itself when the node first asks for it.
#include <arpa/inet.h>
#include <sys/socket.h>

#include <stdexcept>

#include "common/logging.h"
#include "net/ip_address.h"
#include "net/transport_registry.h"
#include "net/ucx/ucx_connection.h"
#include "net/ucx/ucx_worker.h"

namespace hoplite {
namespace {

void setErrorHandling(ucp_ep_params_t& params, UcxWorker& worker) {
  // Peer mode: a peer that dies or closes is reported, not waited for.
  params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &UcxWorker::onEndpointError;
  params.err_handler.arg = &worker;
}

class UcxListener : public Listener {
 public:
  UcxListener(std::shared_ptr<UcxWorker> worker, std::string host, int port, ConnectionObserver* observer,
              AcceptCallback onAccept)
      : worker_(std::move(worker)), host_(std::move(host)), observer_(observer), onAccept_(std::move(onAccept)) {
    sockaddr_in addr = makeAddress(host_, port);
    ucp_listener_params_t params{};
    params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    params.sockaddr.addrlen = sizeof(addr);
    params.conn_handler.cb = &UcxListener::onConnectionRequest;
    params.conn_handler.arg = this;
    ucs_status_t status = ucp_listener_create(worker_->handle(), &params, &listener_);
    if (status != UCS_OK) {
      throw std::runtime_error(ucxError(("UCX: listen on " + host_ + ":" + std::to_string(port)).c_str(), status));
    }
    ucp_listener_attr_t attr{};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    status = ucp_listener_query(listener_, &attr);
    if (status != UCS_OK) {
      ucp_listener_destroy(listener_);
      throw std::runtime_error(ucxError("UCX: ucp_listener_query", status));
    }
    port_ = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  }
  ~UcxListener() override { close(); }

  std::string host() const override { return host_; }
  int port() const override { return port_; }
  void close() override {
    if (listener_ == nullptr) return;
    if (!worker_->stopped()) ucp_listener_destroy(listener_);  // else gone with the worker
    listener_ = nullptr;
  }

 private:
  static void onConnectionRequest(ucp_conn_request_h request, void* arg) {
    static_cast<UcxListener*>(arg)->accept(request);
  }

  void accept(ucp_conn_request_h request) {
    if (listener_ == nullptr) return;
    std::string peer = "unknown address";
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    if (ucp_conn_request_query(request, &attr) == UCS_OK && attr.client_address.ss_family == AF_INET) {
      peer = addressString(*reinterpret_cast<const sockaddr_in*>(&attr.client_address));
    }
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST;
    params.conn_request = request;
    setErrorHandling(params, *worker_);
    ucp_ep_h ep = nullptr;
    const ucs_status_t status = ucp_ep_create(worker_->handle(), &params, &ep);
    if (status != UCS_OK) {
      HLOG(kWarn, "%s", ucxError(("UCX: accepting " + peer).c_str(), status).c_str());
      return;
    }
    auto conn = std::make_shared<UcxConnection>(worker_, peer, false, observer_);
    conn->attach(ep);
    conn->sendAccepted();
    onAccept_(conn);
  }

  std::shared_ptr<UcxWorker> worker_;
  std::string host_;
  int port_ = 0;
  ConnectionObserver* observer_;
  AcceptCallback onAccept_;
  ucp_listener_h listener_ = nullptr;
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

  // Called before the loop starts (or on its thread): the worker is serialized, not locked.
  std::unique_ptr<Listener> listen(const std::string& host, int port, ConnectionObserver* observer,
                                   AcceptCallback onAccept) override {
    return std::make_unique<UcxListener>(worker_, host, port, observer, std::move(onAccept));
  }

  std::shared_ptr<Connection> connect(const std::string& host, int port, ConnectionObserver* observer) override {
    sockaddr_in addr = makeAddress(host, port);
    auto conn = std::make_shared<UcxConnection>(worker_, addressString(addr), true, observer);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
    params.sockaddr.addrlen = sizeof(addr);
    setErrorHandling(params, *worker_);
    ucp_ep_h ep = nullptr;
    const ucs_status_t status = ucp_ep_create(worker_->handle(), &params, &ep);
    if (status != UCS_OK) {
      // Reported from the loop, after the caller has stored the connection.
      Status why(Code::kPeerFailed, ucxError(("connect to " + conn->describe()).c_str(), status));
      worker_->loop().post([conn, why] { conn->close(why); });
      return conn;
    }
    conn->attach(ep);
    worker_->progressSoon();
    return conn;
  }

 private:
  std::shared_ptr<UcxWorker> worker_;
};

[[maybe_unused]] const bool kRegistered = registerTransport("ucx", [](EventLoop& loop, const TransportOptions& options) {
  return std::make_unique<UcxTransport>(loop, options);
});

}  // namespace
}  // namespace hoplite
