// torch dtypes by the names objects carry in their metadata ("float32"), both
// ways, from one table.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

namespace hoplite {

std::optional<c10::ScalarType> scalarTypeNamed(const std::string& name);
// The name of `type`, or torch's own spelling for a dtype objects cannot carry.
std::string nameOf(c10::ScalarType type);

}  // namespace hoplite
