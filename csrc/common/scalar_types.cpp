#include "common/scalar_types.h"

#include <array>
#include <utility>

namespace hoplite {
namespace {

constexpr std::array<std::pair<const char*, c10::ScalarType>, 17> kTypes = {{
    {"bool", c10::kBool},         {"uint8", c10::kByte},        {"int8", c10::kChar},
    {"int16", c10::kShort},       {"int32", c10::kInt},         {"int64", c10::kLong},
    {"uint16", c10::kUInt16},     {"uint32", c10::kUInt32},     {"uint64", c10::kUInt64},
    {"float16", c10::kHalf},      {"bfloat16", c10::kBFloat16}, {"float32", c10::kFloat},
    {"float64", c10::kDouble},    {"complex64", c10::kComplexFloat},
    {"complex128", c10::kComplexDouble},                        {"float8_e4m3fn", c10::kFloat8_e4m3fn},
    {"float8_e5m2", c10::kFloat8_e5m2},
}};

}  // namespace

std::optional<c10::ScalarType> scalarTypeNamed(const std::string& name) {
  for (const auto& [n, t] : kTypes) {
    if (name == n) return t;
  }
  return std::nullopt;
}

std::string nameOf(c10::ScalarType type) {
  for (const auto& [n, t] : kTypes) {
    if (type == t) return n;
  }
  return c10::toString(type);
}

}  // namespace hoplite
