// Static collective algorithms over a Channel. Plain C++ on bytes: they know
// element sizes and a combine kernel, nothing of torch. Every one runs inside
// Channel::begin/end and throws CommError on failure.
#pragma once

#include <cstddef>
#include <cstdint>

#include "c10d/channel.h"
#include "coll/reduce_kernels.h"

namespace hoplite::c10d {

// Elements of one dtype and how to combine them.
struct Elements {
  size_t itemsize = 1;
  CombineFn combine = nullptr;  // null for data movement only
};

// Bytes per pipelined message when `bytes` flow through `hops` stages: what
// balances filling the pipeline (a piece per stage) against the per-message
// cost of many pieces, within [64 KiB, 256 KiB]: 64 KiB at 1 MB, ~150 KiB at
// 16 MB and 256 KiB from ~50 MB over 7 hops.
size_t pieceBytes(size_t bytes, int hops);

// --- ring.cpp: bandwidth-optimal, 2(N-1)/N of the data per rank on the wire ---
// Allreduce of `count` elements from `input` into `data` (which may be the
// same memory): the butterfly below 128 KiB, the ring from there.
void allreduce(Channel& ch, const uint8_t* input, uint8_t* data, size_t count, const Elements& e);
// Allreduce of `count` elements from `input` into `data` (which may be the
// same memory): pipelined reduce-scatter then allgather.
void ringAllreduce(Channel& ch, const uint8_t* input, uint8_t* data, size_t count, const Elements& e);
// `data` holds N blocks of `blockCount` elements; afterwards block `rank` is the
// reduction of everyone's block `rank` (the other blocks are clobbered).
void ringReduceScatter(Channel& ch, uint8_t* data, size_t blockCount, const Elements& e);
// `data` holds N blocks of `blockBytes`; block `rank` is this rank's; afterwards all are filled.
void ringAllgather(Channel& ch, uint8_t* data, size_t blockBytes);

// --- butterfly.cpp: latency-optimal, log2(N) rounds of the whole vector ---
// In-place allreduce by recursive doubling; ranks past the largest power of two
// fold into a partner first and get the result back at the end. Every rank
// combines in rank order, so all end with identical bits.
void butterflyAllreduce(Channel& ch, uint8_t* data, size_t count, const Elements& e);
void barrier(Channel& ch);

// --- tree.cpp: rooted operations ---
// Pipelined chain root → root+1 → … for large data, binomial tree for small.
void broadcast(Channel& ch, uint8_t* data, size_t bytes, int root);
// Pipelined chain … → root+1 → root; `data` is left untouched except at the root.
void chainReduce(Channel& ch, uint8_t* data, size_t count, const Elements& e, int root);

// --- direct.cpp: personalised exchanges, one message per pair ---
// blocks[i] (root only) receives rank i's `bytes`; the root's own is copied.
void gather(Channel& ch, const uint8_t* input, uint8_t* const* blocks, size_t bytes, int root);
void scatter(Channel& ch, const uint8_t* const* blocks, uint8_t* output, size_t bytes, int root);
// Rank r sends sendBlocks[i] (sendBytes[i]) to rank i and receives recvBlocks[i] from it.
void allToAll(Channel& ch, const uint8_t* const* sendBlocks, const size_t* sendBytes, uint8_t* const* recvBlocks,
              const size_t* recvBytes);

}  // namespace hoplite::c10d
