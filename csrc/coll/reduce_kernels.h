// Element-wise reduction of one chunk: the CPU half of a streaming reduce. Plain
// C++ (no torch), vectorised by the compiler with a wider-ISA clone picked at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace hoplite {

// Values travel on the wire; keep them stable.
// BAND/BOR/BXOR: integers and bool only.
enum class ReduceOp : uint8_t { kSum = 0, kProd = 1, kMin = 2, kMax = 3, kAvg = 4, kBand = 5, kBor = 6, kBxor = 7 };
constexpr uint8_t kMaxReduceOp = 7;

const char* reduceOpName(ReduceOp op);

// out[i] = a[i] op b[i] for n elements; out may alias a. AVG accumulates as SUM.
using CombineFn = void (*)(void* out, const void* a, const void* b, size_t n);
// data[i] /= divisor: the last step of AVG.
using DivideFn = void (*)(void* data, size_t n, uint64_t divisor);

struct ReduceKernel {
  CombineFn combine = nullptr;
  DivideFn divide = nullptr;  // AVG only
};

// The kernel for `op` on elements of torch dtype `dtype` (e.g. "float32"), or
// kInvalidArgument saying why the pair is not supported (e.g. MIN of complex,
// AVG of integers, float8).
Status reduceKernel(ReduceOp op, const std::string& dtype, ReduceKernel* out);

}  // namespace hoplite
