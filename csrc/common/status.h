// Status codes shared by the core and reported to Python as typed exceptions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace hoplite {

enum class Code : uint8_t {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kAlreadyExists = 3,
  kDeleted = 4,
  kTimeout = 5,
  kPeerFailed = 6,
  kCapacity = 7,
  kProtocol = 8,
  kShutdown = 9,
  kInternal = 10,
  // The object is being recomputed (a reduce recovering from a failure): look
  // it up again. Gets retry it themselves; it surfaces only as a last error.
  kRetry = 11,
  // The holder a pull went to handed its copy to a get just before: ask the
  // directory for another holder (pulls do so themselves; never surfaces).
  kMoved = 12,
};
constexpr uint8_t kMaxCode = 12;

struct Status {
  Code code = Code::kOk;
  std::string message;

  Status() = default;
  Status(Code c, std::string msg) : code(c), message(std::move(msg)) {}
  bool ok() const { return code == Code::kOk; }
};

}  // namespace hoplite
