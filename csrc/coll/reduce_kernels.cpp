#include "coll/reduce_kernels.h"

#include <immintrin.h>

#include <complex>
#include <cstring>
#include <type_traits>

// -O2's "very cheap" vectoriser leaves a loop of unknown length whose output
// may alias an input scalar (it would need an epilogue and an overlap check):
// the element loops below ran one float at a time, ~30% more CPU than gloo's
// sum in a ring allreduce. The dynamic cost model vectorises them.
#pragma GCC optimize("vect-cost-model=dynamic")

namespace hoplite {
namespace {

// Signed integers add and multiply modulo 2^bits, as torch does, without
// signed-overflow undefined behaviour.
template <typename T>
T wrapAdd(T a, T b) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return static_cast<T>(a + b);
  }
}
template <typename T>
T wrapMul(T a, T b) {
  if constexpr (std::is_integral_v<T> && std::is_signed_v<T>) {
    using U = std::make_unsigned_t<T>;
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;  // no promotion to int
    return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
  } else if constexpr (std::is_integral_v<T> && sizeof(T) < sizeof(unsigned)) {
    return static_cast<T>(static_cast<unsigned>(a) * static_cast<unsigned>(b));
  } else {
    return static_cast<T>(a * b);
  }
}

struct Sum {
  template <typename T>
  static T apply(T a, T b) { return wrapAdd(a, b); }
};
struct Prod {
  template <typename T>
  static T apply(T a, T b) { return wrapMul(a, b); }
};
// MIN and MAX pick one of the two inputs, so they copy its stored bits (no
// rounding back, which also keeps the half-precision loop vectorised). NaN
// wins and ties go to the first, as in torch.minimum / torch.maximum: `a` when
// it is NaN or not larger (smaller), else `b`, which is NaN when b is.
struct Min {
  template <typename T>
  static bool takeFirst(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) return a <= b || a != a;
    return a <= b;
  }
  static bool takeFirstKey(int32_t a, int32_t b, bool aNan, bool bNan) { return aNan || (!bNan && a <= b); }
};
struct Max {
  template <typename T>
  static bool takeFirst(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) return a >= b || a != a;
    return a >= b;
  }
  static bool takeFirstKey(int32_t a, int32_t b, bool aNan, bool bNan) { return aNan || (!bNan && a >= b); }
};
// bool: SUM and MAX are "or", PROD and MIN are "and" (as gloo and NCCL do).
struct Or {
  static bool apply(bool a, bool b) { return a || b; }
};
struct And {
  static bool apply(bool a, bool b) { return a && b; }
};

struct BitAnd {
  template <typename T>
  static T apply(T a, T b) { return static_cast<T>(a & b); }
};
struct BitOr {
  template <typename T>
  static T apply(T a, T b) { return static_cast<T>(a | b); }
};
struct BitXor {
  template <typename T>
  static T apply(T a, T b) { return static_cast<T>(a ^ b); }
};

namespace baseline {
#include "coll/reduce_loops.inc"
}  // namespace baseline

#pragma GCC push_options
#pragma GCC target("avx2,f16c,fma")
#define HOPLITE_LOOPS_F16C
namespace avx2 {
#include "coll/reduce_loops.inc"
}  // namespace avx2
#undef HOPLITE_LOOPS_F16C
#pragma GCC pop_options

bool haveAvx2() {
  static const bool yes =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
  return yes;
}

enum class Kind { kBool, kInteger, kFloat, kComplex };

// Resolves the op for one storage type; each ISA namespace has its own codec type.
template <typename Storage, typename BaseCodec, typename AvxCodec>
Status pick(ReduceOp op, Kind kind, const std::string& dtype, ReduceKernel* out) {
  auto combine = [](auto opTag) -> CombineFn {
    using Op = decltype(opTag);
    return haveAvx2() ? &avx2::combineLoop<Storage, AvxCodec, Op> : &baseline::combineLoop<Storage, BaseCodec, Op>;
  };
  auto invalid = [&](const char* why) {
    return Status(Code::kInvalidArgument,
                  std::string(reduceOpName(op)) + " is not supported for dtype " + dtype + " (" + why + ")");
  };
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      if (op == ReduceOp::kAvg && (kind == Kind::kBool || kind == Kind::kInteger)) {
        return invalid("AVG needs a floating-point or complex dtype");
      }
      if constexpr (std::is_same_v<Storage, bool>) {
        out->combine = combine(Or{});
      } else {
        out->combine = combine(Sum{});
      }
      if (op == ReduceOp::kAvg) {
        if constexpr (!std::is_same_v<Storage, bool> && !std::is_integral_v<typename BaseCodec::C>) {
          out->divide = haveAvx2() ? &avx2::divideLoop<Storage, AvxCodec> : &baseline::divideLoop<Storage, BaseCodec>;
        }
      }
      return Status();
    case ReduceOp::kProd:
      if constexpr (std::is_same_v<Storage, bool>) {
        out->combine = combine(And{});
      } else {
        out->combine = combine(Prod{});
      }
      return Status();
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      if (kind == Kind::kComplex) return invalid("complex numbers are not ordered");
      if constexpr (std::is_same_v<Storage, bool>) {
        out->combine = op == ReduceOp::kMin ? combine(And{}) : combine(Or{});
      } else if constexpr (!std::is_same_v<typename BaseCodec::C, std::complex<float>> &&
                           !std::is_same_v<typename BaseCodec::C, std::complex<double>>) {
        out->combine = op == ReduceOp::kMin ? combine(Min{}) : combine(Max{});
      }
      return Status();
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      if (kind != Kind::kBool && kind != Kind::kInteger) return invalid("bitwise ops need an integer or bool dtype");
      if constexpr (std::is_integral_v<typename BaseCodec::C>) {
        out->combine = op == ReduceOp::kBand ? combine(BitAnd{}) : op == ReduceOp::kBor ? combine(BitOr{}) : combine(BitXor{});
      }
      return Status();
  }
  return invalid("unknown op");
}

template <typename T>
Status plain(ReduceOp op, Kind kind, const std::string& dtype, ReduceKernel* out) {
  return pick<T, baseline::Plain<T>, avx2::Plain<T>>(op, kind, dtype, out);
}

}  // namespace

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "SUM";
    case ReduceOp::kProd: return "PROD";
    case ReduceOp::kMin: return "MIN";
    case ReduceOp::kMax: return "MAX";
    case ReduceOp::kAvg: return "AVG";
    case ReduceOp::kBand: return "BAND";
    case ReduceOp::kBor: return "BOR";
    case ReduceOp::kBxor: return "BXOR";
  }
  return "?";
}

Status reduceKernel(ReduceOp op, const std::string& dtype, ReduceKernel* out) {
  *out = ReduceKernel{};
  if (static_cast<uint8_t>(op) > kMaxReduceOp) {
    return Status(Code::kInvalidArgument, "unknown reduce op " + std::to_string(static_cast<int>(op)));
  }
  if (dtype == "bool") return plain<bool>(op, Kind::kBool, dtype, out);
  if (dtype == "uint8") return plain<uint8_t>(op, Kind::kInteger, dtype, out);
  if (dtype == "int8") return plain<int8_t>(op, Kind::kInteger, dtype, out);
  if (dtype == "int16") return plain<int16_t>(op, Kind::kInteger, dtype, out);
  if (dtype == "uint16") return plain<uint16_t>(op, Kind::kInteger, dtype, out);
  if (dtype == "int32") return plain<int32_t>(op, Kind::kInteger, dtype, out);
  if (dtype == "uint32") return plain<uint32_t>(op, Kind::kInteger, dtype, out);
  if (dtype == "int64") return plain<int64_t>(op, Kind::kInteger, dtype, out);
  if (dtype == "uint64") return plain<uint64_t>(op, Kind::kInteger, dtype, out);
  if (dtype == "float32") return plain<float>(op, Kind::kFloat, dtype, out);
  if (dtype == "float64") return plain<double>(op, Kind::kFloat, dtype, out);
  if (dtype == "complex64") return plain<std::complex<float>>(op, Kind::kComplex, dtype, out);
  if (dtype == "complex128") return plain<std::complex<double>>(op, Kind::kComplex, dtype, out);
  if (dtype == "float16") return pick<uint16_t, baseline::Half, avx2::Half>(op, Kind::kFloat, dtype, out);
  if (dtype == "bfloat16") return pick<uint16_t, baseline::BFloat16, avx2::BFloat16>(op, Kind::kFloat, dtype, out);
  return Status(Code::kInvalidArgument,
                std::string(reduceOpName(op)) + " is not supported for dtype " + dtype + " (no arithmetic for it)");
}

}  // namespace hoplite
