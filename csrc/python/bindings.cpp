// Python bindings. The only translation unit that sees Python; it uses pybind11
// alone (no torch headers), so it compiles in seconds. Tensors are built on the
// Python side from the buffers exported here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "node/node.h"

namespace py = pybind11;
using hoplite::Buffer;
using hoplite::Completion;
using hoplite::Node;
using hoplite::NodeConfig;
using hoplite::ObjectMeta;
using hoplite::Status;

namespace {

py::tuple statusTuple(const Status& s) { return py::make_tuple(static_cast<int>(s.code), s.message); }

template <typename T>
T option(const py::dict& d, const char* key, T fallback) {
  return d.contains(key) ? d[key].cast<T>() : fallback;
}

NodeConfig configFromDict(const py::dict& d) {
  NodeConfig c;
  c.rank = option<int>(d, "rank", c.rank);
  c.worldSize = option<int>(d, "world_size", c.worldSize);
  c.host = option<std::string>(d, "host", c.host);
  c.port = option<int>(d, "port", c.port);
  c.clusterId = option<std::string>(d, "cluster_id", c.clusterId);
  c.chunkBytes = option<uint64_t>(d, "chunk_bytes", c.chunkBytes);
  c.capacityBytes = option<uint64_t>(d, "capacity_bytes", c.capacityBytes);
  c.inlineThresholdBytes = option<uint64_t>(d, "inline_threshold_bytes", c.inlineThresholdBytes);
  c.poolCacheBytes = option<uint64_t>(d, "pool_cache_bytes", c.poolCacheBytes);
  c.connectTimeoutSeconds = option<double>(d, "connect_timeout", c.connectTimeoutSeconds);
  c.copyThreads = option<int>(d, "copy_threads", c.copyThreads);
  c.socketBufferBytes = option<int>(d, "socket_buffer_bytes", c.socketBufferBytes);
  return c;
}

py::tuple metaTuple(const ObjectMeta& m) { return py::make_tuple(m.dtype, m.itemsize, m.shape, m.nbytes, m.device); }

// (token, kind, (code, message), buffer or None, meta or None)
py::tuple completionTuple(const Completion& c) {
  py::object buffer = c.buffer ? py::cast(c.buffer) : py::none();
  bool hasMeta = c.status.ok() && c.kind == Completion::Kind::kGet;
  return py::make_tuple(c.token, static_cast<int>(c.kind), statusTuple(c.status), buffer,
                        hasMeta ? py::object(metaTuple(c.meta)) : py::object(py::none()));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_hoplite core (C++): node runtime, transport, object store, directory";

  py::class_<Buffer, std::shared_ptr<Buffer>>(m, "Buffer", py::buffer_protocol())
      .def_buffer([](Buffer& b) {
        return py::buffer_info(b.data(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.size())}, {1});
      })
      .def("__len__", [](const Buffer& b) { return b.size(); });

  py::class_<Node>(m, "Node")
      .def(py::init([](const py::dict& config) { return std::make_unique<Node>(configFromDict(config)); }))
      .def_property_readonly("host", &Node::host)
      .def_property_readonly("port", &Node::port)
      .def_property_readonly("rank", &Node::rank)
      .def("add_peer", &Node::addPeer, py::arg("rank"), py::arg("host"), py::arg("port"))
      .def(
          "put",
          [](Node& node, const py::bytes& id, const std::string& dtype, uint32_t itemsize, std::vector<int64_t> shape,
             const std::string& device, uintptr_t ptr, uint64_t nbytes, uint64_t token, double timeout) {
            ObjectMeta meta{dtype, itemsize, std::move(shape), nbytes, device};
            std::string key = id;
            Status s;
            {
              py::gil_scoped_release release;
              s = node.put(key, meta, reinterpret_cast<const uint8_t*>(ptr), token, timeout);
            }
            return statusTuple(s);
          },
          py::arg("id"), py::arg("dtype"), py::arg("itemsize"), py::arg("shape"), py::arg("device"), py::arg("ptr"),
          py::arg("nbytes"), py::arg("token"), py::arg("timeout"))
      .def(
          "get",
          [](Node& node, const py::bytes& id, double timeout, bool copy, uint64_t token) -> py::object {
            std::string key = id;
            Completion now;
            bool done;
            {
              py::gil_scoped_release release;
              done = node.get(key, timeout, copy, token, &now);
            }
            return done ? py::object(completionTuple(now)) : py::object(py::none());
          },
          py::arg("id"), py::arg("timeout"), py::arg("copy"), py::arg("token"))
      .def(
          "delete",
          [](Node& node, const py::bytes& id, double timeout) {
            std::string key = id;
            Status s;
            {
              py::gil_scoped_release release;
              s = node.remove(key, timeout);
            }
            return statusTuple(s);
          },
          py::arg("id"), py::arg("timeout"))
      .def(
          "wait_completions",
          [](Node& node, double timeout) -> py::object {
            std::vector<Completion> done;
            bool open;
            {
              py::gil_scoped_release release;
              open = node.waitCompletions(&done, timeout);
            }
            if (!open) return py::none();
            py::list out;
            for (const auto& c : done) out.append(completionTuple(c));
            return std::move(out);
          },
          py::arg("timeout"))
      .def("stats", &Node::stats)
      .def("shutdown", &Node::shutdown, py::call_guard<py::gil_scoped_release>());

  py::dict codes;
  for (uint8_t c = 0; c <= hoplite::kMaxCode; ++c) codes[py::int_(c)] = hoplite::codeName(static_cast<hoplite::Code>(c));
  m.attr("STATUS_NAMES") = codes;
}
