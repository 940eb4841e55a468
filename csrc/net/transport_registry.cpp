#include "net/transport_registry.h"

#include <map>
#include <mutex>
#include <stdexcept>

namespace hoplite {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, TransportFactory> factories;
};

// Built on first use: registrations run from other files' static initializers.
Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

bool registerTransport(const std::string& name, TransportFactory factory) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.factories.emplace(name, std::move(factory)).second) {
    throw std::logic_error("transport '" + name + "' registered twice");
  }
  return true;
}

std::unique_ptr<Transport> makeTransport(const std::string& name, EventLoop& loop, const TransportOptions& options) {
  TransportFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const auto& n : transportNames()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown transport '" + name + "' (this build has: " + known + ")");
  }
  return factory(loop, options);
}

std::vector<std::string> transportNames() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, factory] : r.factories) names.push_back(name);
  return names;
}

}  // namespace hoplite
