// Streaming reduce kernels (see reduce_kernels.h). One grid-stride kernel per
// (dtype, op): 16-byte loads and stores when all three pointers allow it, the
// few elements past the last full vector done by the first threads; element by
// element otherwise.
#include "reduce_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstring>
#include <type_traits>

namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 1 << 16;

// Arithmetic type of a stored type: half precision is computed in float.
template <class T>
struct Compute {
  using type = T;
};
template <>
struct Compute<__half> {
  using type = float;
};
template <>
struct Compute<__nv_bfloat16> {
  using type = float;
};

__device__ inline float widen(__half x) { return __half2float(x); }
__device__ inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
__device__ inline T widen(T x) {
  return x;
}

template <class T>
__device__ inline T narrow(typename Compute<T>::type x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return x;
  }
}

template <class C>
__device__ inline bool isNan(C x) {
  if constexpr (std::is_floating_point_v<C>) {
    return x != x;
  } else {
    return false;
  }
}

// Integers wrap like torch's (computed unsigned: signed overflow is undefined).
template <class C>
__device__ inline C add(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <class C>
__device__ inline C mul(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

struct Sum {
  template <class T>
  __device__ static T apply(T a, T b) {
    return narrow<T>(add(widen(a), widen(b)));
  }
};
struct Prod {
  template <class T>
  __device__ static T apply(T a, T b) {
    return narrow<T>(mul(widen(a), widen(b)));
  }
};
// MIN/MAX return one of the inputs unchanged: NaN wins, ties keep `a`.
template <bool kMin>
struct Extreme {
  template <class T>
  __device__ static T apply(T a, T b) {
    auto x = widen(a), y = widen(b);
    if (isNan(x)) return a;
    if (isNan(y)) return b;
    return (kMin ? y < x : y > x) ? b : a;
  }
};
using Min = Extreme<true>;
using Max = Extreme<false>;

template <class T>
struct alignas(16) Pack {
  static constexpr int kCount = 16 / sizeof(T);
  T v[kCount];
};

template <class T, class Op>
__global__ void combineVectors(T* out, const T* a, const T* b, size_t vectors, size_t n) {
  using P = Pack<T>;
  const size_t first = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = first; i < vectors; i += stride) {
    const P x = reinterpret_cast<const P*>(a)[i];
    const P y = reinterpret_cast<const P*>(b)[i];
    P z;
#pragma unroll
    for (int k = 0; k < P::kCount; ++k) z.v[k] = Op::apply(x.v[k], y.v[k]);
    reinterpret_cast<P*>(out)[i] = z;
  }
  const size_t tail = vectors * P::kCount + first;  // fewer than kCount elements
  if (tail < n) out[tail] = Op::apply(a[tail], b[tail]);
}

template <class T, class Op>
__global__ void combineElements(T* out, const T* a, const T* b, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = Op::apply(a[i], b[i]);
  }
}

template <class T>
__global__ void divideElements(T* data, size_t n, uint64_t divisor) {
  using C = typename Compute<T>::type;
  const C d = static_cast<C>(divisor);
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    data[i] = narrow<T>(widen(data[i]) / d);
  }
}

unsigned blocksFor(size_t items) {
  size_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <class T, class Op>
int launchCombine(void* out, const void* a, const void* b, size_t n, cudaStream_t stream) {
  if (n == 0) return 0;
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (aligned16(out) && aligned16(a) && aligned16(b)) {
    const size_t vectors = n / Pack<T>::kCount;
    combineVectors<T, Op><<<blocksFor(vectors > 0 ? vectors : 1), kThreads, 0, stream>>>(o, x, y, vectors, n);
  } else {
    combineElements<T, Op><<<blocksFor(n), kThreads, 0, stream>>>(o, x, y, n);
  }
  return static_cast<int>(cudaGetLastError());
}

template <class T>
int combineFor(int op, void* out, const void* a, const void* b, size_t n, cudaStream_t stream) {
  switch (op) {
    case HOPLITE_CUDA_SUM: return launchCombine<T, Sum>(out, a, b, n, stream);
    case HOPLITE_CUDA_PROD: return launchCombine<T, Prod>(out, a, b, n, stream);
    case HOPLITE_CUDA_MIN: return launchCombine<T, Min>(out, a, b, n, stream);
    case HOPLITE_CUDA_MAX: return launchCombine<T, Max>(out, a, b, n, stream);
    default: return -1;
  }
}

template <class T>
int launchDivide(void* data, size_t n, uint64_t divisor, cudaStream_t stream) {
  if (n == 0) return 0;
  divideElements<T><<<blocksFor(n), kThreads, 0, stream>>>(static_cast<T*>(data), n, divisor);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

extern "C" int hoplite_cuda_dtype(const char* name) {
  static const struct {
    const char* name;
    int code;
  } kNames[] = {{"float16", HOPLITE_CUDA_FLOAT16}, {"bfloat16", HOPLITE_CUDA_BFLOAT16},
                {"float32", HOPLITE_CUDA_FLOAT32}, {"float64", HOPLITE_CUDA_FLOAT64},
                {"int32", HOPLITE_CUDA_INT32},     {"int64", HOPLITE_CUDA_INT64}};
  for (const auto& entry : kNames) {
    if (std::strcmp(entry.name, name) == 0) return entry.code;
  }
  return -1;
}

extern "C" int hoplite_cuda_combine(int op, int dtype, void* out, const void* a, const void* b, size_t n,
                                    void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case HOPLITE_CUDA_FLOAT16: return combineFor<__half>(op, out, a, b, n, s);
    case HOPLITE_CUDA_BFLOAT16: return combineFor<__nv_bfloat16>(op, out, a, b, n, s);
    case HOPLITE_CUDA_FLOAT32: return combineFor<float>(op, out, a, b, n, s);
    case HOPLITE_CUDA_FLOAT64: return combineFor<double>(op, out, a, b, n, s);
    case HOPLITE_CUDA_INT32: return combineFor<int32_t>(op, out, a, b, n, s);
    case HOPLITE_CUDA_INT64: return combineFor<int64_t>(op, out, a, b, n, s);
    default: return -1;
  }
}

extern "C" int hoplite_cuda_divide(int dtype, void* data, size_t n, uint64_t divisor, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case HOPLITE_CUDA_FLOAT16: return launchDivide<__half>(data, n, divisor, s);
    case HOPLITE_CUDA_BFLOAT16: return launchDivide<__nv_bfloat16>(data, n, divisor, s);
    case HOPLITE_CUDA_FLOAT32: return launchDivide<float>(data, n, divisor, s);
    case HOPLITE_CUDA_FLOAT64: return launchDivide<double>(data, n, divisor, s);
    default: return -1;  // AVG is not defined for integers
  }
}

extern "C" const char* hoplite_cuda_error_string(int code) {
  if (code == -1) return "unsupported reduce op or dtype";
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}
