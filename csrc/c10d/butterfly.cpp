// Recursive doubling: log2(N) rounds in which partners r and r^mask exchange
// everything they have. Latency-bound sizes only (each round moves the whole vector).
#include "c10d/algorithms.h"

namespace hoplite::c10d {

void butterflyAllreduce(Channel& ch, uint8_t* data, size_t count, const Elements& e) {
  const int n = ch.size();
  const int r = ch.rank();
  if (n == 1) return;
  const size_t bytes = count * e.itemsize;
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int extra = n - p2;
  constexpr uint64_t kFold = 0, kUnfold = 63;
  auto combine = [&](const uint8_t* lower, const uint8_t* upper) {
    if (e.combine && count > 0) e.combine(data, lower, upper, count);
  };

  if (r >= p2) {  // fold into r - p2, then get the result from it
    auto sent = ch.send(r - p2, kFold, data, bytes);
    ch.wait(sent);
    auto back = ch.recv(r - p2, kUnfold, data, bytes);
    ch.wait(back);
    return;
  }
  uint8_t* tmp = ch.scratch(bytes);
  if (r < extra) {
    auto folded = ch.recv(r + p2, kFold, tmp, bytes);
    ch.wait(folded);
    combine(data, tmp);
  }
  uint64_t round = 1;
  for (int mask = 1; mask < p2; mask <<= 1, ++round) {
    const int partner = r ^ mask;
    auto in = ch.recv(partner, round, tmp, bytes);
    auto out = ch.send(partner, round, data, bytes);
    ch.wait(out);  // before `data` changes
    ch.wait(in);
    if (partner < r) {
      combine(tmp, data);
    } else {
      combine(data, tmp);
    }
  }
  if (r < extra) {
    auto back = ch.send(r + p2, kUnfold, data, bytes);
    ch.wait(back);
  }
}

void barrier(Channel& ch) { butterflyAllreduce(ch, nullptr, 0, Elements{1, nullptr}); }

}  // namespace hoplite::c10d
