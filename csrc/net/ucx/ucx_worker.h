// One UCP context and worker per transport, driven by the node's event loop:
// the worker's event fd sits in epoll (no busy polling), and every pass
// progresses the worker, hands what arrived to the connections, and re-arms.
// Active messages arrive here and go to the connection their header names;
// observer callbacks run only after ucp_worker_progress returns, so the node
// may send or close from them.
#pragma once

#include <ucp/api/ucp.h>

#include <array>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "net/event_loop.h"
#include "net/transport.h"

namespace hoplite {

class UcxConnection;

// Active message ids. Each header starts with the receiver's id of the
// connection (u64, from the bootstrap hello), then a wire frame header
// (magic, version, type, length) so that a frame is checked as on TCP; data
// frames add the data sub-header. The payload is the message's data.
enum UcxAm : unsigned {
  kUcxControlAm = 1,
  kUcxDataAm = 2,
  kUcxEndAm = 3,  // after a graceful close's last frame: nothing more comes
};
constexpr size_t kUcxIdSize = 8;

// Names a UCS status in errors.
std::string ucxError(const char* what, ucs_status_t status);

class UcxWorker : public EventHandler, public std::enable_shared_from_this<UcxWorker> {
 public:
  // Throws std::runtime_error naming what UCX refused.
  UcxWorker(EventLoop& loop, const TransportOptions& options);
  ~UcxWorker() override;
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  // Registers the event fd with the loop; call once after construction.
  void open();
  // The transport is going away (its loop has stopped): endpoints still open
  // are closed at once without telling their observers, then the worker and
  // the context are destroyed, so that UCX's threads are gone before the
  // process may exit. Connections outliving it are closed and inert.
  void shutdown();
  bool stopped() const { return worker_ == nullptr; }

  ucp_worker_h handle() const { return worker_; }
  // This worker's address, for the bootstrap hello.
  const std::string& address() const { return address_; }
  // A fresh id for a connection: random, so that a peer cannot name another's.
  uint64_t newConnectionId();
  EventLoop& loop() { return loop_; }
  const TransportOptions& options() const { return options_; }

  // After posting operations: one progress pass before the loop waits again
  // (the worker must be progressed before it can be armed).
  void progressSoon();
  // Up to one turn of progress calls, handing nothing to the observers
  // (abandonData and shutdown call it until their deadlines); true if UCX
  // had nothing left to do.
  bool progressQuietly();

  // Closes `ep` by force (operations under way are cancelled); the worker is
  // not destroyed before the close completes. Asked from inside a progress
  // call (a callback), it waits until that call returns: UCX aborts when an
  // endpoint is closed while its pending sends are being dispatched.
  void closeEndpoint(ucp_ep_h ep);
  // Messages naming `id` go to `conn`; errors of `ep` too.
  void add(uint64_t id, ucp_ep_h ep, const std::shared_ptr<UcxConnection>& conn);
  void remove(uint64_t id, ucp_ep_h ep);
  // A connection with something to hand to its observer after this pass.
  void markReady(const std::shared_ptr<UcxConnection>& conn);

  void handleEvents(uint32_t events) override;

  // Error handler of every endpoint: `arg` is the worker.
  static void onEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status);

 private:
  void progress();
  // One ucp_worker_progress call, then (unless nested in another) the
  // closes its callbacks asked for.
  unsigned progressOnce();
  // Progresses again after the loop's other work: at once for a stream,
  // after a moment for an arm that stays busy with nothing to do.
  void resumeLater(bool streaming);
  void deliver();
  void reapClosed();  // frees the close requests that completed
  UcxConnection* connectionOf(uint64_t id);
  // Every active message id's handler; `arg` is its AmRoute.
  static ucs_status_t onAm(void* arg, const void* header, size_t headerSize, void* data, size_t size,
                           const ucp_am_recv_param_t* param);
  struct AmRoute {
    UcxWorker* worker;
    UcxAm id;
  };

  EventLoop& loop_;
  TransportOptions options_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int eventFd_ = -1;
  bool stopping_ = false;
  bool progressing_ = false;
  bool progressQueued_ = false;
  bool resumeQueued_ = false;
  std::string address_;
  std::mt19937_64 ids_;
  std::unordered_map<uint64_t, std::weak_ptr<UcxConnection>> connections_;
  std::unordered_map<ucp_ep_h, uint64_t> endpoints_;  // -> connection id, for errors
  std::vector<std::shared_ptr<UcxConnection>> ready_;
  bool insideProgress_ = false;        // in ucp_worker_progress
  std::vector<ucp_ep_h> toClose_;      // asked for inside it
  std::vector<void*> closing_;         // close requests not yet complete
  std::array<AmRoute, 3> amRoutes_;
};

}  // namespace hoplite
