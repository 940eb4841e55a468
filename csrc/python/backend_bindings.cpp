// Binds the c10d backend factory. Its own file: it needs torch's pybind
// casters for c10d::Backend, the heaviest headers of the build.
#include <torch/extension.h>

#include <optional>

#include "c10d/backend.h"
#include "python/node_handle.h"

namespace py = pybind11;

namespace hoplite {

namespace {
// The backend as Python holds it. Its last reference may be dropped by a
// Python thread, which holds the GIL while the destructor joins the worker
// thread; the worker may be releasing a finished collective's tensors then,
// which takes the GIL. So the join lets go of it.
class PythonOwnedBackend final : public c10d::HopliteBackend {
 public:
  using HopliteBackend::HopliteBackend;
  ~PythonOwnedBackend() override {
    std::optional<py::gil_scoped_release> release;
    if (PyGILState_Check()) release.emplace();
    shutdown();
  }
};
}  // namespace

void bindBackend(py::module& m) {
  m.def(
      "create_backend",
      [](NodeHandle& handle, const std::string& groupName, int rank, std::vector<int> globalRanks,
         double timeoutSeconds) -> c10::intrusive_ptr<::c10d::Backend> {
        const int world = static_cast<int>(globalRanks.size());
        TORCH_CHECK(rank >= 0 && rank < world, "hoplite backend: rank ", rank, " is not in a group of ", world);
        for (int g : globalRanks) {
          TORCH_CHECK(g >= 0, "hoplite backend: negative global rank ", g);
        }
        auto timeout = std::chrono::milliseconds(static_cast<int64_t>(timeoutSeconds * 1000));
        std::shared_ptr<Node> node = handle.sharedNode();
        // Holds the node as long as the backend uses its messenger and pool.
        std::shared_ptr<TaggedMessenger> messenger(node, &node->messenger());
        auto allocate = [node](size_t bytes) { return node->allocate(bytes); };
        return c10::make_intrusive<PythonOwnedBackend>(std::move(messenger), std::move(allocate), groupName, rank,
                                                         std::move(globalRanks), timeout);
      },
      py::arg("node"), py::arg("group_name"), py::arg("rank"), py::arg("global_ranks"), py::arg("timeout"));
}

}  // namespace hoplite
