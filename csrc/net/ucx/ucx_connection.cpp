#include "net/ucx/ucx_connection.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <vector>

#include "common/logging.h"
#include "common/step_trace.h"

namespace hoplite {
namespace {

std::atomic<uint64_t> gNextConnectionId{1u << 30};  // apart from TCP's, for logs
// Data bytes handed to UCX and not yet sent, per connection: enough to keep a
// rendezvous pipeline busy, small enough that a new flow's frames get their
// share soon (the rest wait in the fair queue).
constexpr size_t kWindowBytes = 8u << 20;
constexpr size_t kSeqSize = 8;  // every message's number in its connection, from 0
// How long abandonData waits for a rendezvous already writing into the memory.
constexpr double kAbandonWaitSeconds = 1.0;

void traceFrame(Step step, const Connection& conn, uint64_t request, uint64_t offset, size_t size) {
  if (tracing()) {
    detail::recordStep(step, std::to_string(request) + "/" + std::to_string(offset), conn.peerRank(), size);
  }
}

}  // namespace

struct UcxConnection::Inbound {
  enum class Kind { kControl, kData, kEnd } kind;
  enum class State { kWaiting, kReceiving, kLanded } state = State::kWaiting;
  wire::MsgType type = wire::MsgType::kData;
  void* desc = nullptr;       // UCX's: the eager payload or the rendezvous descriptor, until released
  bool rendezvous = false;
  size_t size = 0;
  uint64_t request = 0, offset = 0;   // data frames
  uint8_t* dest = nullptr;            // where a data frame goes (nullptr: dropped)
  std::shared_ptr<const void> keepalive;
  std::vector<uint8_t> control;       // a control payload received by rendezvous (or copied)
  bool abandoned = false;
};

struct UcxConnection::SendOp {
  std::shared_ptr<UcxConnection> conn;
  UcxAm id = kUcxControlAm;
  // The receiver's connection id, the sequence number, then the frame header
  // (and sub-header).
  uint8_t header[kUcxIdSize + kSeqSize + wire::kHeaderSize + wire::kDataSubheaderSize];
  size_t frameHeaderSize = 0;
  uint8_t* frameHeader() { return header + kUcxIdSize + kSeqSize; }
  const void* data = nullptr;
  size_t size = 0;
  std::string payload;                    // control frames
  std::shared_ptr<const void> keepalive;  // data frames
  uint64_t request = 0, offset = 0;       // data frames, for tracing
  size_t bytesInFlight() const { return id == kUcxDataAm ? size : 0; }
};

struct UcxConnection::ReceiveOp {
  std::shared_ptr<UcxConnection> conn;
  std::shared_ptr<Inbound> in;  // keeps the destination's keepalive until UCX is done with it
};

struct UcxConnection::FlushOp {
  std::shared_ptr<UcxConnection> conn;
};

UcxConnection::UcxConnection(std::shared_ptr<UcxWorker> worker, std::string peerAddress, ConnectionObserver* observer)
    : Connection(gNextConnectionId++),
      worker_(std::move(worker)),
      peerAddress_(std::move(peerAddress)),
      observer_(observer),
      localId_(worker_->newConnectionId()) {}

UcxConnection::~UcxConnection() {
  // Freed by UCX once closed; nothing of ours is referenced any more.
  if (ep_ != nullptr && !endpointClosed_ && !worker_->stopped()) closeEndpoint();
}

void UcxConnection::attach(ucp_ep_h ep, uint64_t remoteId) {
  ep_ = ep;
  remoteId_ = remoteId;
  worker_->add(localId_, ep, shared_from_this());
  // What was sent while the hellos were exchanged goes first, in order.
  std::deque<std::unique_ptr<SendOp>> early;
  early.swap(early_);
  for (auto& op : early) post(std::move(op));
  sendQueuedData();
}

std::string UcxConnection::describe() const {
  std::string who = peerRank() >= 0 ? "rank " + std::to_string(peerRank()) + " at " : "";
  return who + peerAddress_ + " (ucx)";
}

// ---------------------------------------------------------------- sending

void UcxConnection::sendControl(wire::MsgType type, std::string payload) {
  if (closed_ || ending_) return;
  auto op = std::make_unique<SendOp>();
  wire::encodeHeader(op->frameHeader(), type, payload.size());
  op->frameHeaderSize = wire::kHeaderSize;
  op->payload = std::move(payload);
  op->data = op->payload.data();
  op->size = op->payload.size();
  post(std::move(op));
}

void UcxConnection::sendData(uint64_t flow, uint64_t request, uint64_t offset, const uint8_t* data, size_t size,
                             std::shared_ptr<const void> keepalive) {
  if (closed_ || ending_) return;
  const uint64_t tag = flowTags_.next(flow, size, sentTag_);
  queued_.emplace(tag, QueuedData{request, offset, data, size, std::move(keepalive)});
  sendQueuedData();
}

void UcxConnection::sendQueuedData() {
  // At least one frame in flight, whatever its size.
  while (!queued_.empty() && !closed_ && ep_ != nullptr && (bytesInFlight_ == 0 || bytesInFlight_ < kWindowBytes)) {
    auto next = queued_.begin();
    sentTag_ = next->first;
    QueuedData frame = std::move(next->second);
    queued_.erase(next);
    auto op = std::make_unique<SendOp>();
    op->id = kUcxDataAm;
    wire::encodeHeader(op->frameHeader(), wire::MsgType::kData, wire::kDataSubheaderSize + frame.size);
    wire::encodeDataSubheader(op->frameHeader() + wire::kHeaderSize, frame.request, frame.offset);
    op->frameHeaderSize = wire::kHeaderSize + wire::kDataSubheaderSize;
    op->keepalive = std::move(frame.keepalive);
    op->data = frame.data;
    op->size = frame.size;
    op->request = frame.request;
    op->offset = frame.offset;
    bytesInFlight_ += frame.size;
    traceFrame(Step::kFrameSend, *this, frame.request, frame.offset, frame.size);
    post(std::move(op));
  }
}

void UcxConnection::post(std::unique_ptr<SendOp> op) {
  if (ep_ == nullptr) {  // dialing: the peer's hello has not come yet
    early_.push_back(std::move(op));
    return;
  }
  op->conn = shared_from_this();
  std::memcpy(op->header, &remoteId_, kUcxIdSize);
  const uint64_t seq = sentSeq_++;
  std::memcpy(op->header + kUcxIdSize, &seq, kSeqSize);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxConnection::onSent;
  SendOp* raw = op.release();
  param.user_data = raw;
  // The header must stay valid until the send completes: it lives in the op.
  const size_t headerSize = kUcxIdSize + kSeqSize + raw->frameHeaderSize;
  ucs_status_ptr_t request = ucp_am_send_nbx(ep_, raw->id, raw->header, headerSize, raw->data, raw->size, &param);
  if (!UCS_PTR_IS_PTR(request)) {  // done at once, or failed at once: no callback comes
    std::unique_ptr<SendOp> done(raw);
    sent(*done, UCS_PTR_STATUS(request));
  }
  worker_->progressSoon();
}

void UcxConnection::onSent(void* request, ucs_status_t status, void* user) {
  std::unique_ptr<SendOp> op(static_cast<SendOp*>(user));
  ucp_request_free(request);
  op->conn->sent(*op, status);
}

void UcxConnection::sent(SendOp& op, ucs_status_t status) {
  bytesInFlight_ -= op.bytesInFlight();
  if (op.id == kUcxDataAm) traceFrame(Step::kFrameSent, *this, op.request, op.offset, op.size);
  if (closed_) return;
  if (ending_) {
    if (status != UCS_OK) fail(endWhy_);  // the end message cannot go: nothing to wait for
    return;
  }
  if (status != UCS_OK) {
    fail(Status(Code::kPeerFailed, ucxError(("send to " + describe()).c_str(), status)));
    return;
  }
  sendQueuedData();
}

// ---------------------------------------------------------------- receiving

ucs_status_t UcxConnection::onAm(UcxAm id, const void* header, size_t headerSize, void* data, size_t size,
                                 const ucp_am_recv_param_t* param) {
  if (closed_ || failing_) return UCS_OK;
  uint64_t seq = 0;
  if (headerSize < kSeqSize) {
    fail(Status(Code::kProtocol, "message without a sequence number from " + describe()));
    return UCS_OK;
  }
  std::memcpy(&seq, header, kSeqSize);
  header = static_cast<const uint8_t*>(header) + kSeqSize;
  headerSize -= kSeqSize;
  if (seq < nextSeq_ || inbox_.count(seq) != 0) {
    fail(Status(Code::kProtocol, "message sequence number reused by " + describe()));
    return UCS_OK;
  }
  if (ending_) {  // dropped until the peer's end (or failure), as TCP drops input while ending
    if (id == kUcxEndAm) fail(endWhy_);
    return UCS_OK;
  }
  if (id == kUcxEndAm) {  // after every frame the peer sent (in sequence): it sends nothing more
    auto end = std::make_shared<Inbound>();
    end->kind = Inbound::Kind::kEnd;
    inbox_.emplace(seq, std::move(end));
    markReady();
    return UCS_OK;
  }
  const bool isData = id == kUcxDataAm;
  const size_t subheader = isData ? wire::kDataSubheaderSize : 0;
  const wire::FrameLimits limits = trusted_ ? worker_->options().limits : wire::kHandshakeLimits;
  wire::FrameHeader frame;
  Status s = headerSize == wire::kHeaderSize + subheader
                 ? wire::decodeHeader(static_cast<const uint8_t*>(header), limits, &frame)
                 : Status(Code::kProtocol, "bad frame header size " + std::to_string(headerSize));
  if (s.ok() && (static_cast<wire::MsgType>(frame.type) == wire::MsgType::kData) != isData) {
    s = Status(Code::kProtocol, "frame type " + std::to_string(frame.type) + " in the wrong kind of message");
  }
  if (s.ok() && frame.length != subheader + size) s = Status(Code::kProtocol, "frame length disagrees with its payload");
  if (s.ok() && isData && !trusted_) s = Status(Code::kProtocol, "data frame before the handshake");
  if (!s.ok()) {
    fail(Status(Code::kProtocol, s.message + " from " + describe()));
    return UCS_OK;
  }
  auto in = std::make_shared<Inbound>();
  in->kind = isData ? Inbound::Kind::kData : Inbound::Kind::kControl;
  in->type = static_cast<wire::MsgType>(frame.type);
  in->size = size;
  if (isData) {
    wire::decodeDataSubheader(static_cast<const uint8_t*>(header) + wire::kHeaderSize, &in->request, &in->offset);
    traceFrame(Step::kFrameArrived, *this, in->request, in->offset, size);
  }
  in->rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  ucs_status_t keep = UCS_INPROGRESS;
  if (in->rendezvous || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA)) {
    in->desc = data;
  } else {  // not kept by UCX (PERSISTENT_DATA asks it to be): copied
    in->control.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + size);
    keep = UCS_OK;
  }
  inbox_.emplace(seq, std::move(in));
  markReady();
  return keep;
}

void UcxConnection::onEndpointError(ucs_status_t status) {
  peerGone_ = true;
  if (closed_) return;
  if (ending_) {  // the peer's end or its failure: either ends the graceful close
    fail(endWhy_);
    return;
  }
  // (Only attached endpoints have an error handler to call this.)
  fail(Status(Code::kPeerFailed, ucxError(("connection to " + describe()).c_str(), status)));
}

void UcxConnection::fail(const Status& why) {
  // After what arrived in order before it, as a TCP stream's end comes after its bytes.
  if (failing_) return;
  failing_ = true;
  failWhy_ = why;
  markReady();
}

void UcxConnection::markReady() {
  if (readyMarked_) return;
  readyMarked_ = true;
  worker_->markReady(shared_from_this());
  worker_->progressSoon();  // when called outside a progress pass (a send failed at once)
}

const uint8_t* UcxConnection::payloadOf(const Inbound& in) {
  if (in.desc != nullptr && !in.rendezvous) return static_cast<const uint8_t*>(in.desc);
  return in.control.data();
}

void UcxConnection::startReceive(Inbound& in, const std::shared_ptr<Inbound>& hold) {
  uint8_t* dest;
  if (in.kind == Inbound::Kind::kControl) {
    in.control.resize(in.size);
    dest = in.control.data();
  } else {
    in.dest = observer_->dataDestination(*this, in.request, in.offset, in.size, &in.keepalive);
    dest = in.dest;
    if (closed_) return;
  }
  if (!in.rendezvous) {  // an eager data frame, in UCX's buffer already
    if (dest != nullptr) std::memcpy(dest, payloadOf(in), in.size);
    release(in);
    in.state = Inbound::State::kLanded;
    if (in.kind == Inbound::Kind::kData) traceFrame(Step::kFrameLanded, *this, in.request, in.offset, in.size);
    return;
  }
  if (dest == nullptr) {  // dropped: the sender's send completes without the bytes moving
    release(in);
    in.state = Inbound::State::kLanded;
    return;
  }
  auto* op = new ReceiveOp{shared_from_this(), hold};
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.recv_am = &UcxConnection::onReceived;
  param.user_data = op;
  void* desc = in.desc;
  in.desc = nullptr;  // UCX owns it from here
  in.state = Inbound::State::kReceiving;
  traceFrame(Step::kFrameReceive, *this, in.request, in.offset, in.size);
  ucs_status_ptr_t request = ucp_am_recv_data_nbx(worker_->handle(), desc, dest, in.size, &param);
  if (!UCS_PTR_IS_PTR(request)) {
    std::unique_ptr<ReceiveOp> done(op);
    received(*done, UCS_PTR_STATUS(request));
  }
}

void UcxConnection::onReceived(void* request, ucs_status_t status, size_t, void* user) {
  std::unique_ptr<ReceiveOp> op(static_cast<ReceiveOp*>(user));
  ucp_request_free(request);
  op->conn->received(*op, status);
}

void UcxConnection::received(ReceiveOp& op, ucs_status_t status) {
  op.in->state = Inbound::State::kLanded;
  if (op.in->kind == Inbound::Kind::kData) traceFrame(Step::kFrameLanded, *this, op.in->request, op.in->offset, op.in->size);
  if (status != UCS_OK) {
    op.in->dest = nullptr;
    fail(Status(Code::kPeerFailed, ucxError(("receive from " + describe()).c_str(), status)));
  }
  markReady();
}

void UcxConnection::release(Inbound& in) {
  if (in.desc != nullptr) ucp_am_data_release(worker_->handle(), in.desc);
  in.desc = nullptr;
}

void UcxConnection::deliver() {
  readyMarked_ = false;
  auto self = shared_from_this();  // an observer may drop its last reference
  // In the sender's order (UCX may hand over a rendezvous after a later message).
  while (!closed_) {
    auto next = inbox_.find(nextSeq_);
    if (next == inbox_.end()) break;
    std::shared_ptr<Inbound> in = next->second;
    if (in->kind == Inbound::Kind::kEnd) {
      close(Status(Code::kPeerFailed, "connection closed by " + describe()));
      return;
    }
    if (in->state == Inbound::State::kWaiting && (in->kind == Inbound::Kind::kData || in->rendezvous)) {
      startReceive(*in, in);
    }
    if (closed_) return;
    if (in->kind == Inbound::Kind::kData && in->state != Inbound::State::kLanded) break;
    if (in->kind == Inbound::Kind::kControl && in->rendezvous && in->state != Inbound::State::kLanded) break;
    inbox_.erase(next);
    ++nextSeq_;
    if (in->kind == Inbound::Kind::kControl) {
      observer_->onFrame(*this, in->type, payloadOf(*in), in->size);
      release(*in);
    } else if (in->dest != nullptr && !in->abandoned) {
      observer_->onDataReceived(*this, in->request, in->offset + in->size);
    }
  }
  if (closed_) return;
  // The data frames right behind a data frame still landing are received
  // meanwhile (their destinations are known: no control frame comes between).
  auto landing = inbox_.find(nextSeq_);
  if (landing != inbox_.end() && landing->second->kind == Inbound::Kind::kData) {
    for (uint64_t seq = nextSeq_ + 1; !closed_; ++seq) {
      auto it = inbox_.find(seq);
      if (it == inbox_.end() || it->second->kind != Inbound::Kind::kData) break;
      std::shared_ptr<Inbound> in = it->second;
      if (in->state == Inbound::State::kWaiting) startReceive(*in, in);
    }
  }
  // A failure ends the connection once nothing in order is still landing
  // (what comes after a gap never will).
  if (!closed_ && failing_ && (landing == inbox_.end() || landing->second->state != Inbound::State::kReceiving)) {
    close(failWhy_);
  }
}

void UcxConnection::abandonData(uint64_t request) {
  std::vector<std::shared_ptr<Inbound>> landing;
  for (auto& [seq, in] : inbox_) {
    if (in->kind != Inbound::Kind::kData || in->request != request || in->state == Inbound::State::kWaiting) continue;
    in->abandoned = true;
    if (in->state == Inbound::State::kReceiving) landing.push_back(in);
  }
  if (landing.empty()) return;
  // A rendezvous cannot be called back: its owner may reuse the memory once
  // this returns, so wait for the bytes on their way to land.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kAbandonWaitSeconds);
  auto stillLanding = [&] {
    for (auto& in : landing) {
      if (in->state == Inbound::State::kReceiving) return true;
    }
    return false;
  };
  while (stillLanding() && std::chrono::steady_clock::now() < deadline) worker_->progressQuietly();
  worker_->progressSoon();
  if (stillLanding()) {
    // Not possible to stop: ending the endpoint stops UCX writing.
    close(Status(Code::kPeerFailed, "a receive from " + describe() + " was abandoned and did not finish in time"));
  }
}

// ---------------------------------------------------------------- closing
//
// Endpoints are only ever closed by force (UCX cannot destroy a worker while a
// flushing close is pending, and a hung peer would leave one pending). So that
// nothing handed to UCX is lost, a close from this side first flushes the
// endpoint (its sends have landed), and a graceful close sends an end message
// after its last frame and waits for the peer's end, or its failure, as TCP
// waits for the peer's FIN after its own.

void UcxConnection::closeEndpoint() {
  if (endpointClosed_) return;
  endpointClosed_ = true;
  worker_->remove(localId_, ep_);
  worker_->closeEndpoint(ep_);
}

void UcxConnection::flushThenCloseEndpoint() {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxConnection::onFlushed;
  auto* op = new FlushOp{shared_from_this()};
  param.user_data = op;
  ucs_status_ptr_t request = ucp_ep_flush_nbx(ep_, &param);
  if (!UCS_PTR_IS_PTR(request)) {
    delete op;
    closeEndpoint();
  }
}

void UcxConnection::onFlushed(void* request, ucs_status_t, void* user) {
  std::unique_ptr<FlushOp> op(static_cast<FlushOp*>(user));
  ucp_request_free(request);
  op->conn->closeEndpoint();
}

void UcxConnection::close(const Status& why) {
  if (closed_) return;
  auto self = shared_from_this();
  closed_ = true;
  dropPending();
  if (ep_ != nullptr && !endpointClosed_) {
    // Ending or failed: the peer sends nothing more, or cannot receive.
    if (ending_ || peerGone_) {
      closeEndpoint();
    } else {
      flushThenCloseEndpoint();
    }
    worker_->progressSoon();
  }
  observer_->onClosed(*this, why);
}

void UcxConnection::dropPending() {
  for (auto& [seq, in] : inbox_) release(*in);
  inbox_.clear();
  queued_.clear();
  early_.clear();
}

void UcxConnection::abort() {
  closed_ = true;
  dropPending();
  if (ep_ != nullptr) closeEndpoint();  // a flush still under way is cancelled
}

void UcxConnection::closeGracefully(const Status& why) {
  if (closed_ || ending_) return;
  if (ep_ == nullptr || failing_) {
    close(why);
    return;
  }
  // What waits for the window is dropped (its senders were not told it was
  // sent), as on TCP; what was handed to UCX goes before the end message.
  ending_ = true;
  endWhy_ = why;
  dropPending();
  auto end = std::make_unique<SendOp>();
  end->id = kUcxEndAm;
  post(std::move(end));
}

}  // namespace hoplite
