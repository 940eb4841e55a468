// Personalised exchanges: every pair talks directly, all messages in flight at once.
#include <cstring>
#include <vector>

#include "c10d/algorithms.h"

namespace hoplite::c10d {

void gather(Channel& ch, const uint8_t* input, uint8_t* const* blocks, size_t bytes, int root) {
  std::vector<Channel::Pending> ops;
  if (ch.rank() != root) {
    ops.push_back(ch.send(root, 0, input, bytes));
  } else {
    for (int i = 0; i < ch.size(); ++i) {
      if (i != root) ops.push_back(ch.recv(i, 0, blocks[i], bytes));
    }
    if (bytes > 0) std::memcpy(blocks[root], input, bytes);
  }
  ch.waitAll(ops);
}

void scatter(Channel& ch, const uint8_t* const* blocks, uint8_t* output, size_t bytes, int root) {
  std::vector<Channel::Pending> ops;
  if (ch.rank() != root) {
    ops.push_back(ch.recv(root, 0, output, bytes));
  } else {
    for (int i = 0; i < ch.size(); ++i) {
      if (i != root) ops.push_back(ch.send(i, 0, blocks[i], bytes));
    }
    if (bytes > 0) std::memcpy(output, blocks[root], bytes);
  }
  ch.waitAll(ops);
}

void allToAll(Channel& ch, const uint8_t* const* sendBlocks, const size_t* sendBytes, uint8_t* const* recvBlocks,
              const size_t* recvBytes) {
  const int n = ch.size();
  const int r = ch.rank();
  std::vector<Channel::Pending> ops;
  for (int k = 1; k < n; ++k) {
    const int from = (r - k + n) % n;
    ops.push_back(ch.recv(from, 0, recvBlocks[from], recvBytes[from]));
  }
  for (int k = 1; k < n; ++k) {  // staggered, so no rank is everyone's first target
    const int to = (r + k) % n;
    ops.push_back(ch.send(to, 0, sendBlocks[to], sendBytes[to]));
  }
  if (sendBytes[r] > 0) std::memmove(recvBlocks[r], sendBlocks[r], sendBytes[r]);
  ch.waitAll(ops);
}

}  // namespace hoplite::c10d
