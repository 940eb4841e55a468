#include "net/transport_registry.h"

#include <dirent.h>
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <set>
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

constexpr const char* kPluginPrefix = "_transport_";

// The folder this library was loaded from: transports built apart lie beside it.
std::string libraryFolder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&registerTransport), &info) == 0 || info.dli_fname == nullptr) return ".";
  std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Transports built as shared objects of their own: `_transport_<name>.*so`.
std::map<std::string, std::string> pluginFiles() {
  std::map<std::string, std::string> files;
  const std::string folder = libraryFolder();
  DIR* dir = opendir(folder.c_str());
  if (dir == nullptr) return files;
  const std::string prefix = kPluginPrefix;
  while (const dirent* entry = readdir(dir)) {
    const std::string file = entry->d_name;
    if (file.rfind(prefix, 0) != 0 || file.size() < 3 || file.compare(file.size() - 3, 3, ".so") != 0) continue;
    const size_t dot = file.find('.', prefix.size());
    files.emplace(file.substr(prefix.size(), dot - prefix.size()), folder + "/" + file);
  }
  closedir(dir);
  return files;
}

// Loads the transport's shared object, whose static initializer registers it
// (it links against this library, already loaded). Returns dlerror's words
// (e.g. the UCX library it could not find), or "" if loaded or none exists.
std::string loadPlugin(const std::string& name) {
  auto files = pluginFiles();
  auto it = files.find(name);
  if (it == files.end()) return "";
  if (dlopen(it->second.c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {  // kept loaded for the process
    const char* error = dlerror();
    return error != nullptr ? error : "dlopen failed";
  }
  return "";
}

TransportFactory findFactory(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.factories.find(name);
  return it != r.factories.end() ? it->second : TransportFactory{};
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
  TransportFactory factory = findFactory(name);
  if (!factory) {
    const std::string loadError = loadPlugin(name);  // not under the mutex: it registers itself
    if (!loadError.empty()) {
      throw std::runtime_error("transport '" + name + "' is built but cannot be loaded: " + loadError);
    }
    factory = findFactory(name);
  }
  if (!factory) {
    std::string known;
    for (const auto& n : transportNames()) known += (known.empty() ? "" : ", ") + n;
    throw std::invalid_argument("unknown transport '" + name + "' (this build has: " + known + ")");
  }
  return factory(loop, options);
}

std::vector<std::string> transportNames() {
  std::set<std::string> names;
  for (const auto& [name, file] : pluginFiles()) names.insert(name);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& [name, factory] : r.factories) names.insert(name);
  return {names.begin(), names.end()};
}

}  // namespace hoplite
