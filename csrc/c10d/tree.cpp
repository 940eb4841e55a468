// Rooted collectives. Ranks are taken relative to the root (v = r - root mod N).
#include <algorithm>
#include <cmath>
#include <vector>

#include "c10d/algorithms.h"

namespace hoplite::c10d {
namespace {

// Below this a chain's N-1 hops cost more than the binomial tree's log2(N) rounds.
constexpr size_t kBinomialBytes = 256u << 10;
// A message's fixed cost (control frame, wake-ups on both ends) in bytes of
// link time: fitted to broadcasts of 16 MB among 8 ranks at 1 Gbit/s when all
// pieces were posted at once (64 KiB pieces took 1.16x the ideal, 128-256 KiB
// 1.11-1.13x). With the posting window below, 64-150 KiB are alike there
// (1.09-1.10x); the rule's larger pieces take less CPU.
constexpr double kMessageCostBytes = 8u << 10;

int absolute(const Channel& ch, int v, int root) { return (v + root) % ch.size(); }

void binomialBroadcast(Channel& ch, uint8_t* data, size_t bytes, int root) {
  const int n = ch.size();
  const int v = (ch.rank() - root + n) % n;
  int mask = 1;
  while (mask < n) mask <<= 1;
  if (v != 0) {
    const int low = v & -v;
    auto in = ch.recv(absolute(ch, v - low, root), 0, data, bytes);
    ch.wait(in);
    mask = low;
  }
  std::vector<Channel::Pending> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (v + mask < n) sends.push_back(ch.send(absolute(ch, v + mask, root), 0, data, bytes));
  }
  ch.waitAll(sends);
}

// Piece j covers elements [j*per, min((j+1)*per, count)).
size_t piecesOf(size_t count, size_t per) { return (count + per - 1) / per; }

// A rank of a chain starts with this many bytes (at least 4 pieces) of
// receives posted and keeps at most as many sends in flight behind the piece
// it waits for, instead of posting every piece at once: a few hundred messages
// posted together took milliseconds of CPU on every rank at the start,
// delaying the ranks still arriving. 8 MiB is over 60 ms of a 1 Gbit/s link.
constexpr size_t kAheadBytes = 8u << 20;
size_t piecesAhead(size_t bytesPerPiece) { return std::max<size_t>(4, kAheadBytes / bytesPerPiece); }

// After each piece that arrives, up to two more receives are posted until
// kReceiveGrowth times the start's are ahead: a rank whose thread falls behind
// its arrivals (combining, or waiting on its own sends) would otherwise get
// pieces with no receive posted, each copied once more out of the mailbox (a
// fixed 8 MiB left 6-31% of a reduce's pieces so at N = 8, 256 MB; growing to
// 32 MiB, none but on the leaf's neighbour).
constexpr size_t kReceiveGrowth = 4;
template <typename PostRecv>
void postMoreReceives(std::vector<Channel::Pending>& recvs, size_t arrived, size_t pieces, size_t ahead,
                      PostRecv postRecv) {
  const size_t limit = std::min(pieces, arrived + 1 + kReceiveGrowth * ahead);
  for (int k = 0; k < 2 && recvs.size() < limit; ++k) recvs.push_back(postRecv(recvs.size()));
}

}  // namespace

size_t pieceBytes(size_t bytes, int hops) {
  // h hops in pieces of s bytes take (bytes/s + h - 1) steps of s/B + c each
  // (B: the link's rate, c: a message's fixed cost); s = sqrt(bytes * cB / (h - 1))
  // makes that least. Capped at 256 KiB: at 256 MB over 7 hops 600 KiB pieces
  // took 12-23 ms (0.5-1%) longer than 256 KiB ones; 128 KiB saved 0-3 ms more
  // for 0.2 more cores.
  const double s = std::sqrt(static_cast<double>(bytes) * kMessageCostBytes / std::max(hops - 1, 1));
  return std::clamp<size_t>(static_cast<size_t>(s), 64u << 10, 256u << 10);
}

void broadcast(Channel& ch, uint8_t* data, size_t bytes, int root) {
  const int n = ch.size();
  if (n == 1) return;
  if (bytes <= kBinomialBytes) {
    binomialBroadcast(ch, data, bytes, root);
    return;
  }
  const int v = (ch.rank() - root + n) % n;
  // Two ranks: nothing is forwarded, so pieces would only add per-message work.
  const size_t piece = n == 2 ? bytes : pieceBytes(bytes, n - 1);
  const size_t count = piecesOf(bytes, piece);
  const size_t ahead = piecesAhead(piece);
  auto length = [&](size_t j) { return std::min(piece, bytes - j * piece); };
  auto postRecv = [&](size_t j) { return ch.recv(absolute(ch, v - 1, root), j, data + j * piece, length(j)); };
  std::vector<Channel::Pending> recvs, sends;
  for (size_t j = 0; v > 0 && j < std::min(ahead, count); ++j) recvs.push_back(postRecv(j));
  for (size_t j = 0; j < count; ++j) {
    if (v > 0) {
      ch.wait(recvs[j]);
      postMoreReceives(recvs, j, count, ahead, postRecv);
    }
    if (v + 1 < n) {
      if (j >= ahead) ch.wait(sends[j - ahead]);
      sends.push_back(ch.send(absolute(ch, v + 1, root), j, data + j * piece, length(j)));
    }
  }
  ch.waitAll(sends);
}

void chainReduce(Channel& ch, uint8_t* data, size_t count, const Elements& e, int root) {
  const int n = ch.size();
  if (n == 1) return;
  const int v = (ch.rank() - root + n) % n;
  const bool leaf = v == n - 1;
  const size_t isz = e.itemsize;
  const size_t per = std::max<size_t>(1, pieceBytes(count * isz, n - 1) / isz);
  const size_t pieces = piecesOf(count, per);
  const size_t ahead = piecesAhead(per * isz);
  // Each rank combines what it receives into that same scratch (the root into
  // its tensor) and forwards it, so inputs stay as they were; the leaf sends its
  // input as it is.
  uint8_t* tmp = leaf ? nullptr : ch.scratch(count * isz);
  auto length = [&](size_t j) { return std::min(per, count - j * per); };
  auto postRecv = [&](size_t j) { return ch.recv(absolute(ch, v + 1, root), j, tmp + j * per * isz, length(j) * isz); };
  std::vector<Channel::Pending> recvs, sends;
  for (size_t j = 0; !leaf && j < std::min(ahead, pieces); ++j) recvs.push_back(postRecv(j));
  for (size_t j = 0; j < pieces; ++j) {
    const size_t first = j * per;
    const size_t len = length(j);
    uint8_t* out = leaf ? data + first * isz : (v == 0 ? data : tmp) + first * isz;
    if (!leaf) {
      ch.wait(recvs[j]);
      postMoreReceives(recvs, j, pieces, ahead, postRecv);
      e.combine(out, data + first * isz, tmp + first * isz, len);
    }
    if (v > 0) {
      if (j >= ahead) ch.wait(sends[j - ahead]);
      sends.push_back(ch.send(absolute(ch, v - 1, root), j, out, len * isz));
    }
  }
  ch.waitAll(sends);
}

}  // namespace hoplite::c10d
