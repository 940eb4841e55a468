// A connection over one UCP endpoint. Control frames are active messages sent
// at once; data frames wait in a fair queue (FlowTags) and go out as active
// messages while fewer than a window's bytes are in flight, so that flows
// share the endpoint as on TCP. Every message carries its sequence number:
// what arrives waits in an inbox and is handed to the observer in the
// sender's order (UCX may deliver a rendezvous after a later message). A
// rendezvous payload is received straight into the buffer the observer names
// (started once every control frame before it was handed over), and the
// frames after it wait until it has landed, as bytes on a TCP stream would.
#pragma once

#include <ucp/api/ucp.h>

#include <deque>
#include <map>
#include <memory>
#include <string>

#include "net/flow_tags.h"
#include "net/transport.h"
#include "net/ucx/ucx_worker.h"
#include "wire/frame.h"

namespace hoplite {

class UcxConnection : public Connection, public std::enable_shared_from_this<UcxConnection> {
 public:
  // Not yet established: frames sent meanwhile wait for attach().
  UcxConnection(std::shared_ptr<UcxWorker> worker, std::string peerAddress, ConnectionObserver* observer);
  ~UcxConnection() override;

  // This side's id of the connection, for its bootstrap hello.
  uint64_t localId() const { return localId_; }
  // The endpoint to the peer (made with the worker's error handler) and the
  // peer's id of the connection: established; what waited is sent.
  void attach(ucp_ep_h ep, uint64_t remoteId);
  // The bootstrap's TCP connect completed: a close from now on means the
  // peer is there and went away or refused us, not that it is not up yet.
  void markReached() { reached_ = true; }

  void sendControl(wire::MsgType type, std::string payload) override;
  void sendData(uint64_t flow, uint64_t request, uint64_t offset, const uint8_t* data, size_t size,
                std::shared_ptr<const void> keepalive) override;
  void abandonData(uint64_t request) override;
  void close(const Status& why) override;
  void closeGracefully(const Status& why) override;
  bool isOpen() const override { return !closed_; }
  bool isEnding() const override { return ending_; }
  // As TCP's: once the connect completed, before the hellos too.
  bool wasEstablished() const override { return ep_ != nullptr || reached_; }
  std::string describe() const override;
  void markTrusted() override { trusted_ = true; }

  // From the worker, inside ucp_worker_progress.
  ucs_status_t onAm(UcxAm id, const void* header, size_t headerSize, void* data, size_t size,
                    const ucp_am_recv_param_t* param);
  void onEndpointError(ucs_status_t status);
  // The worker is shutting down: the endpoint is closed at once and nothing
  // more is told to the observer.
  void abort();
  // From the worker after the progress pass: hands over what is in order.
  void deliver();

 private:
  struct Inbound;
  struct SendOp;
  struct ReceiveOp;
  struct FlushOp;
  struct QueuedData {
    uint64_t request, offset;
    const uint8_t* data;
    size_t size;
    std::shared_ptr<const void> keepalive;
  };

  void post(std::unique_ptr<SendOp> op);
  static void onSent(void* request, ucs_status_t status, void* user);
  void sent(SendOp& op, ucs_status_t status);
  void sendQueuedData();
  // Names the destination and starts a rendezvous (or copies an eager data frame).
  void startReceive(Inbound& in, const std::shared_ptr<Inbound>& hold);
  static void onReceived(void* request, ucs_status_t status, size_t length, void* user);
  void received(ReceiveOp& op, ucs_status_t status);
  static const uint8_t* payloadOf(const Inbound& in);
  void release(Inbound& in);  // gives UCX back its buffer or descriptor
  // The connection ends with `why` once what arrived before is handed over.
  void fail(const Status& why);
  void markReady();
  void dropPending();    // what arrived and was not handed over, and what waits to be sent
  void closeEndpoint();  // by force: operations still under way are cancelled
  void flushThenCloseEndpoint();
  static void onFlushed(void* request, ucs_status_t status, void* user);

  std::shared_ptr<UcxWorker> worker_;
  std::string peerAddress_;
  ConnectionObserver* observer_;
  ucp_ep_h ep_ = nullptr;
  uint64_t localId_;
  uint64_t remoteId_ = 0;
  bool reached_ = false;       // the bootstrap's TCP connect completed
  bool trusted_ = false;
  bool closed_ = false;
  bool ending_ = false;
  bool endpointClosed_ = false;  // ucp_ep_close_nbx was called
  bool peerGone_ = false;        // UCX reported the endpoint failed
  bool failing_ = false;         // ends with failWhy_ once what is in order is handed over
  bool readyMarked_ = false;     // on the worker's ready list for this pass
  Status endWhy_;

  std::map<uint64_t, std::shared_ptr<Inbound>> inbox_;  // by sequence number
  uint64_t nextSeq_ = 0;  // the next to hand over
  uint64_t sentSeq_ = 0;  // the next to send
  Status failWhy_;

  std::deque<std::unique_ptr<SendOp>> early_;  // sent before the endpoint existed
  std::multimap<uint64_t, QueuedData> queued_;  // by start tag
  FlowTags flowTags_;
  uint64_t sentTag_ = 0;  // the start tag of the last data frame handed to UCX
  size_t bytesInFlight_ = 0;
};

}  // namespace hoplite
