// A non-blocking TCP connection driven by the event loop: a write queue of
// frames sent with writev straight from their buffers (control frames ahead of
// data frames not yet started; data frames fair-queued by bytes between flows),
// and a read state machine that receives data-frame payloads straight into the
// destination buffer, and small frames through a read-ahead buffer.
#pragma once

#include <sys/uio.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "net/event_loop.h"
#include "net/flow_tags.h"
#include "net/transport.h"

namespace hoplite {

class TcpConnection : public Connection, public EventHandler, public std::enable_shared_from_this<TcpConnection> {
 public:
  TcpConnection(EventLoop& loop, int fd, bool connecting, std::string peerAddress, ConnectionObserver* observer,
                const TransportOptions& options);
  ~TcpConnection() override;

  // Registers with the loop; call once, on the loop thread, after construction.
  void open();

  void sendControl(wire::MsgType type, std::string payload) override;
  void sendData(uint64_t flow, uint64_t request, uint64_t offset, const uint8_t* data, size_t size,
                std::shared_ptr<const void> keepalive) override;
  void abandonData(uint64_t request) override;
  void close(const Status& why) override;
  void closeGracefully(const Status& why) override;
  bool isOpen() const override { return fd_ >= 0; }
  bool isEnding() const override { return ending_; }
  bool wasEstablished() const override { return !connecting_; }
  std::string describe() const override;
  void markTrusted() override { trusted_ = true; }

  void handleEvents(uint32_t events) override;

 private:
  struct Outgoing {
    uint8_t head[wire::kHeaderSize + wire::kDataSubheaderSize];
    size_t headSize = 0;
    std::string owned;           // control payload
    const uint8_t* data = nullptr;  // data payload (borrowed, kept alive by keepalive)
    size_t dataSize = 0;
    std::shared_ptr<const void> keepalive;
    uint64_t flow = 0;   // data frames only
    uint64_t start = 0;  // data frames only: the queue is sorted by it (fair queueing by bytes)
    size_t sent = 0;  // over head + payload
    size_t total() const { return headSize + (data ? dataSize : owned.size()); }
  };
  enum class ReadState { kHeader, kControl, kDataSubheader, kDataPayload };

  void finishConnect();
  void readSome();
  void readFrames();  // until the socket is drained, the budget spent, or it closes
  // Moves up to `want` bytes into dst (nullptr: drop them): from the read-ahead
  // buffer if it has any, else straight from the socket when that many are
  // wanted, else by refilling the buffer. Returns the count, 0 when the socket
  // is drained, -1 when the connection closed; *drained: the socket is empty.
  ssize_t take(uint8_t* dst, size_t want, size_t* budget, bool* drained);
  void dropInput();  // while ending: reads and drops until the peer's end of stream
  // SO_RCVLOWAT: how many bytes must be queued before the socket reads as ready.
  void setLowWater(size_t bytes);
  size_t lowWaterFor(size_t payloadLeft) const;
  // Gives a data frame its start tag (FlowTags) and returns where it joins
  // the queue: after every frame with a tag up to its own.
  std::deque<Outgoing>::iterator dataSlot(Outgoing& frame);
  // Writes what is queued once the handlers at hand are done: an announce and
  // its data frame, or several answers, leave in one sendmsg (and one packet).
  void flushSoon();
  void flush();
  void updateInterest();
  void onHeader();

  EventLoop& loop_;
  int fd_;
  bool connecting_;
  std::string peerAddress_;
  ConnectionObserver* observer_;
  TransportOptions options_;
  bool closed_ = false;
  bool ending_ = false;  // closeGracefully was called: only waiting for the peer's end
  Status endWhy_;
  bool trusted_;

  std::deque<Outgoing> outq_;
  uint64_t sentStart_ = 0;  // the start tag of the last data frame sent
  FlowTags flowTags_;
  bool wantWrite_ = false;
  bool flushQueued_ = false;

  ReadState readState_ = ReadState::kHeader;
  uint8_t header_[wire::kHeaderSize];
  size_t headerGot_ = 0;
  wire::FrameHeader frame_;
  std::vector<uint8_t> control_;
  size_t controlGot_ = 0;
  uint8_t sub_[wire::kDataSubheaderSize];
  size_t subGot_ = 0;
  uint64_t dataRequest_ = 0, dataOffset_ = 0, dataSize_ = 0, dataGot_ = 0;
  uint8_t* dataDest_ = nullptr;
  std::shared_ptr<const void> dataKeep_;  // holds dataDest_'s memory for the frame
  std::vector<uint8_t> discard_;
  // Read-ahead: one recv brings a frame's header, an announce and the next
  // frame's header and subheader at once, instead of one recv for each.
  std::unique_ptr<uint8_t[]> ahead_;
  size_t aheadBegin_ = 0, aheadEnd_ = 0;
  size_t lowWater_ = 1;  // the kernel's default
  bool lowWaterRaised_ = false;  // for the payload being read
};

}  // namespace hoplite
