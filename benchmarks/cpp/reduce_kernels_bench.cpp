// Throughput of the CPU reduce kernels (csrc/coll/reduce_kernels.*) against
// memcpy on the same buffers. Built and run by benchmarks/reduce_kernels.py;
// prints one JSON record per line.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "coll/reduce_kernels.h"

using hoplite::ReduceKernel;
using hoplite::ReduceOp;

namespace {

double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best of `reps` runs of fn over the chunk, in bytes of output per second.
template <typename Fn>
double bestRate(size_t bytes, int reps, Fn fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    double t0 = seconds();
    fn();
    best = std::min(best, seconds() - t0);
  }
  return static_cast<double>(bytes) / best;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t chunk = argc > 1 ? std::stoul(argv[1]) : (2u << 20);  // a reduce step
  const size_t total = 256u << 20;                                    // streamed through, chunk by chunk
  std::vector<uint8_t> a(total, 1), b(total, 1), out(total, 0);
  const double copy = bestRate(total, 5, [&] {
    for (size_t off = 0; off < total; off += chunk) std::memcpy(out.data() + off, a.data() + off, chunk);
  });
  std::printf("{\"kernel\": \"memcpy\", \"chunk_bytes\": %zu, \"gbytes_per_s\": %.3f}\n", chunk, copy / 1e9);
  const char* dtypes[] = {"float32", "float64", "float16", "bfloat16", "int32", "int64", "int8"};
  const size_t itemsize[] = {4, 8, 2, 2, 4, 8, 1};
  for (int op = 0; op <= 4; ++op) {
    for (size_t d = 0; d < sizeof(dtypes) / sizeof(dtypes[0]); ++d) {
      ReduceKernel k;
      if (!hoplite::reduceKernel(static_cast<ReduceOp>(op), dtypes[d], &k).ok()) continue;
      std::memset(a.data(), 0, total);  // zeros: finite in every dtype
      std::memset(b.data(), 0, total);
      const size_t n = chunk / itemsize[d];
      const double rate = bestRate(total, 5, [&] {
        for (size_t off = 0; off < total; off += chunk) k.combine(out.data() + off, a.data() + off, b.data() + off, n);
      });
      std::printf("{\"kernel\": \"%s\", \"dtype\": \"%s\", \"chunk_bytes\": %zu, \"gbytes_per_s\": %.3f, "
                  "\"vs_memcpy\": %.3f}\n",
                  hoplite::reduceOpName(static_cast<ReduceOp>(op)), dtypes[d], chunk, rate / 1e9, rate / copy);
    }
  }
  return 0;
}
