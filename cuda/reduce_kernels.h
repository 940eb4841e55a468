// Streaming reduce kernels for CUDA tensors (issue #5): the device half of a
// tree reduce step, `out = a op b` over one chunk. A plain C interface, so the
// core (C++ without CUDA headers) and tests (ctypes) can call it, and the file
// compiles with nvcc alone.
//
// `a` and `b` may be device memory or pinned host memory (cudaHostAlloc /
// cudaHostRegister): with unified addressing a kernel reads a chunk that sits
// in a pinned store buffer in place, so a child's chunk is accumulated into the
// device result without a staging copy. `out` may alias `a`.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Stable values (they match ReduceOp in csrc/coll/reduce_kernels.h; AVG is a
// SUM followed by hoplite_cuda_divide at the root).
enum HopliteCudaOp { HOPLITE_CUDA_SUM = 0, HOPLITE_CUDA_PROD = 1, HOPLITE_CUDA_MIN = 2, HOPLITE_CUDA_MAX = 3 };

enum HopliteCudaDtype {
  HOPLITE_CUDA_FLOAT16 = 0,
  HOPLITE_CUDA_BFLOAT16 = 1,
  HOPLITE_CUDA_FLOAT32 = 2,
  HOPLITE_CUDA_FLOAT64 = 3,
  HOPLITE_CUDA_INT32 = 4,
  HOPLITE_CUDA_INT64 = 5,
};

// The dtype code for a torch dtype name ("float32", ...), or -1 if unsupported.
int hoplite_cuda_dtype(const char* name);

// Enqueues out[i] = a[i] op b[i], i < n, on `stream` (a cudaStream_t; NULL for
// the legacy default stream). Returns 0, or a cudaError_t value (use
// hoplite_cuda_error_string), or -1 for an unknown op or dtype. float16 and
// bfloat16 are computed in float and rounded to nearest even; integers wrap;
// MIN/MAX propagate NaN and keep the first input on ties, as the CPU kernels.
int hoplite_cuda_combine(int op, int dtype, void* out, const void* a, const void* b, size_t n, void* stream);

// Enqueues data[i] /= divisor (the end of AVG; floating-point dtypes only).
int hoplite_cuda_divide(int dtype, void* data, size_t n, uint64_t divisor, void* stream);

const char* hoplite_cuda_error_string(int code);

#ifdef __cplusplus
}
#endif
