// Ring collectives. One pass of T steps: at step t rank r sends segment
// (r - t + shift) to its right and receives segment (r - t - 1 + shift) from
// its left, combining it into its own copy during the first `reduceSteps`
// steps and storing it after. The segment received at step t is the one sent at
// step t+1, so each piece is forwarded as soon as it is combined: the pass is
// pipelined across steps, not just within one.
#include <algorithm>
#include <cstring>
#include <vector>

#include "c10d/algorithms.h"

namespace hoplite::c10d {
namespace {

constexpr int kPieceBits = 20;  // sub-tag = step << 20 | piece

// Allreduce sizes below this take the butterfly (log2 N rounds), above the ring
// (2(N-1) steps but 2(N-1)/N of the data): the crossover of the two cost models
// for N = 8 at 100 us and 1 Gbit/s is ~100 KB.
constexpr size_t kRingAllreduceBytes = 128u << 10;

// Bytes per message of a segment. The pass is pipelined across steps, so
// filling it costs about one piece whatever their number, and a piece is
// forwarded while the rest of its segment still arrives as long as a segment
// has a few. Each message costs CPU at both ends (thread wake-ups, syscalls,
// bookkeeping), so pieces are as large as that allows: an eighth of a segment,
// up to 4 MiB (the largest message sent ahead of its receive). At 256 MB, N = 8
// (32 MB segments): 512 KiB pieces 0.66-0.70 cores against gloo's 0.56-0.60,
// 4 MiB 0.49-0.55 and the same time after the last rank's start as gloo;
// 8 MiB (a quarter) was 7 ms slower.
size_t ringPieceBytes(size_t segmentBytes) { return std::clamp<size_t>(segmentBytes / 8, 256u << 10, 4u << 20); }

// `input`: where step 0's sends and the combines read this rank's own
// elements: `data` itself, or the input of an out-of-place allreduce, which
// reads it only so (every segment of `data` is written by a combine or a
// receive before anything reads it there).
void ringPass(Channel& ch, const uint8_t* input, uint8_t* data, const std::vector<size_t>& begin, const Elements& e,
              int reduceSteps, int steps, int shift) {
  const int n = ch.size();
  const int r = ch.rank();
  if (n == 1 || steps == 0) return;
  const int right = (r + 1) % n;
  const int left = (r + n - 1) % n;
  size_t largest = 0;
  for (int i = 0; i < n; ++i) largest = std::max(largest, begin[i + 1] - begin[i]);
  const size_t per =
      std::max({size_t{1}, ringPieceBytes(largest * e.itemsize) / e.itemsize, (largest >> kPieceBits) + 1});  // elements
  const size_t isz = e.itemsize;
  uint8_t* tmp = reduceSteps > 0 ? ch.scratch(largest * isz) : nullptr;

  auto segment = [&](int t, int delta) { return (((r - t + delta + shift) % n) + n) % n; };
  auto pieces = [&](int s) { return (begin[s + 1] - begin[s] + per - 1) / per; };
  auto tag = [](int t, size_t j) { return (static_cast<uint64_t>(t) << kPieceBits) | j; };
  std::vector<Channel::Pending> recvs(pieces(segment(0, -1)) + 1);
  std::vector<Channel::Pending> sends;

  auto postRecv = [&](int t, size_t j) {
    const int s = segment(t, -1);
    const size_t first = begin[s] + j * per;
    const size_t len = std::min(per, begin[s + 1] - first);
    uint8_t* dest = t < reduceSteps ? tmp + j * per * isz : data + first * isz;
    if (j >= recvs.size()) recvs.resize(j + 1);
    recvs[j] = ch.recv(left, tag(t, j), dest, len * isz);
  };
  auto sendPiece = [&](int t, size_t j) {
    const int s = segment(t, 0);
    const size_t first = begin[s] + j * per;
    const size_t len = std::min(per, begin[s + 1] - first);
    sends.push_back(ch.send(right, tag(t, j), (t == 0 ? input : data) + first * isz, len * isz));
  };

  for (size_t j = 0; j < pieces(segment(0, -1)); ++j) postRecv(0, j);
  for (size_t j = 0; j < pieces(segment(0, 0)); ++j) sendPiece(0, j);
  for (int t = 0; t < steps; ++t) {
    const int s = segment(t, -1);
    const size_t have = pieces(s);
    const size_t next = t + 1 < steps ? pieces(segment(t + 1, -1)) : 0;
    for (size_t j = 0; j < have; ++j) {
      ch.wait(recvs[j]);
      if (t < reduceSteps) {
        const size_t first = begin[s] + j * per;
        const size_t len = std::min(per, begin[s + 1] - first);
        e.combine(data + first * isz, input + first * isz, tmp + j * per * isz, len);
      }
      if (t + 1 < steps) {
        if (j < next) postRecv(t + 1, j);  // its scratch piece was just consumed
        sendPiece(t + 1, j);
      }
    }
    for (size_t j = have; j < next; ++j) postRecv(t + 1, j);
  }
  ch.waitAll(sends);
}

std::vector<size_t> equalBlocks(int n, size_t blockCount) {
  std::vector<size_t> begin(n + 1);
  for (int i = 0; i <= n; ++i) begin[i] = i * blockCount;
  return begin;
}

}  // namespace

void allreduce(Channel& ch, const uint8_t* input, uint8_t* data, size_t count, const Elements& e) {
  const size_t bytes = count * e.itemsize;
  if (bytes >= kRingAllreduceBytes) {
    ringAllreduce(ch, input, data, count, e);
    return;
  }
  if (input != data && bytes > 0) std::memcpy(data, input, bytes);
  butterflyAllreduce(ch, data, count, e);
}

void ringAllreduce(Channel& ch, const uint8_t* input, uint8_t* data, size_t count, const Elements& e) {
  const int n = ch.size();
  if (n == 1 && input != data && count > 0) std::memcpy(data, input, count * e.itemsize);
  std::vector<size_t> begin(n + 1);
  for (int i = 0; i <= n; ++i) begin[i] = count * i / n;
  ringPass(ch, input, data, begin, e, n - 1, 2 * (n - 1), 0);
}

void ringReduceScatter(Channel& ch, uint8_t* data, size_t blockCount, const Elements& e) {
  const int n = ch.size();
  ringPass(ch, data, data, equalBlocks(n, blockCount), e, n - 1, n - 1, -1);
}

void ringAllgather(Channel& ch, uint8_t* data, size_t blockBytes) {
  const int n = ch.size();
  ringPass(ch, data, data, equalBlocks(n, blockBytes), Elements{1, nullptr}, 0, n - 1, 0);
}

}  // namespace hoplite::c10d
