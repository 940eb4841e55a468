#include "common/status.h"

namespace hoplite {

const char* codeName(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kNotFound: return "not found";
    case Code::kAlreadyExists: return "already exists";
    case Code::kDeleted: return "deleted";
    case Code::kTimeout: return "timeout";
    case Code::kPeerFailed: return "peer failed";
    case Code::kCapacity: return "capacity";
    case Code::kProtocol: return "protocol";
    case Code::kShutdown: return "shutdown";
    case Code::kInternal: return "internal";
  }
  return "unknown";
}

}  // namespace hoplite
