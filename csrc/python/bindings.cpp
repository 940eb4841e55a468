// The Python module torch_hoplite._C. Declarations only; the work happens in
// NodeHandle (node_handle.cpp, the one file that includes torch headers).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/hmac.h"
#include "common/step_trace.h"
#include "net/transport_registry.h"
#include "wire/frame.h"
#include "python/node_handle.h"

namespace py = pybind11;
using hoplite::NodeConfig;
using hoplite::NodeHandle;
using hoplite::Status;

namespace {

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
  c.transport = option<std::string>(d, "transport", c.transport);
  c.clusterId = option<std::string>(d, "cluster_id", c.clusterId);
  c.secret = option<std::string>(d, "secret", c.secret);
  c.chunkBytes = option<uint64_t>(d, "chunk_bytes", c.chunkBytes);
  c.capacityBytes = option<uint64_t>(d, "capacity_bytes", c.capacityBytes);
  c.inlineThresholdBytes = option<uint64_t>(d, "inline_threshold_bytes", c.inlineThresholdBytes);
  c.poolCacheBytes = option<uint64_t>(d, "pool_cache_bytes", c.poolCacheBytes);
  c.connectTimeoutSeconds = option<double>(d, "connect_timeout", c.connectTimeoutSeconds);
  c.heartbeatIntervalSeconds = option<double>(d, "heartbeat_interval", c.heartbeatIntervalSeconds);
  c.heartbeatTimeoutSeconds = option<double>(d, "heartbeat_timeout", c.heartbeatTimeoutSeconds);
  c.copyThreads = option<int>(d, "copy_threads", c.copyThreads);
  c.socketBufferBytes = option<int>(d, "socket_buffer_bytes", c.socketBufferBytes);
  c.tcpCongestion = option<std::string>(d, "tcp_congestion", c.tcpCongestion);
  c.mailboxBytes = option<uint64_t>(d, "mailbox_bytes", c.mailboxBytes);
  c.sameHost = option<bool>(d, "same_host", c.sameHost);
  c.heapTrimIntervalSeconds = option<double>(d, "heap_trim_interval", c.heapTrimIntervalSeconds);
  return c;
}

py::dict planDict(const hoplite::ReducePlan& plan) {
  py::dict d;
  d["dtype"] = plan.meta.dtype;
  d["shape"] = plan.meta.shape;
  d["nbytes"] = plan.meta.nbytes;
  d["used"] = plan.used;
  d["holders"] = plan.holders;
  d["lost"] = plan.lost;
  d["recoveries"] = plan.recoveries;
  d["degree"] = plan.tree.degree;
  d["depth"] = plan.tree.depth;
  d["root"] = plan.tree.root;
  d["parent"] = plan.tree.parent;
  d["latency_s"] = plan.link.latencySeconds;
  d["bandwidth_Bps"] = plan.link.bytesPerSecond;
  d["link_measured"] = plan.linkMeasured;
  d["plan_s"] = plan.planSeconds;
  return d;
}

// Returns (code, message, plan); plan is None unless code is 0.
py::tuple reduce(NodeHandle& h, const py::bytes& resultId, const std::vector<py::bytes>& inputIds, int count, int op,
                 int degree, double timeout, bool ordered) {
  hoplite::ReduceRequest request;
  request.resultId = resultId;
  for (const auto& id : inputIds) request.inputIds.push_back(id);
  request.count = count;
  request.op = static_cast<hoplite::ReduceOp>(op);
  request.degree = degree;
  request.timeoutSeconds = timeout;
  request.ordered = ordered;
  hoplite::ReducePlan plan;
  Status s;
  {
    py::gil_scoped_release release;
    s = h.node().reduce(request, &plan);
  }
  if (!s.ok()) return py::make_tuple(static_cast<int>(s.code), s.message, py::none());
  return py::make_tuple(0, std::string(), planDict(plan));
}

// Returns (code, message, plan) once the reduce into `resultId` has ended.
py::tuple reduceOutcome(NodeHandle& h, const py::bytes& resultId, double timeout) {
  hoplite::ReducePlan plan;
  Status s;
  {
    py::gil_scoped_release release;
    s = h.node().reduceOutcome(resultId, timeout, &plan);
  }
  if (!s.ok()) return py::make_tuple(static_cast<int>(s.code), s.message, py::none());
  return py::make_tuple(0, std::string(), planDict(plan));
}

// Returns (code, message, version, state, complete, partial, inlined, last_holder).
py::tuple nextLocations(NodeHandle& h, uint64_t handle, uint64_t seen, double timeout) {
  hoplite::wire::Locations loc;
  uint64_t version = 0;
  Status s;
  {
    py::gil_scoped_release release;
    s = h.node().subscriptions().next(handle, seen, timeout, &loc, &version);
  }
  return py::make_tuple(static_cast<int>(s.code), s.message, version, static_cast<int>(loc.state), loc.complete,
                        loc.partial, loc.inlined, loc.lastHolder);
}

}  // namespace

namespace hoplite {
void bindBackend(py::module& m);  // backend_bindings.cpp
}

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_hoplite core (C++): node runtime, transport, object store, directory";
#ifdef HOPLITE_WITH_CUDA
  m.attr("with_cuda") = true;  // CUDA tensors go through the staging path (cuda/staging.h)
#else
  m.attr("with_cuda") = false;
#endif
  m.attr("wire_version") = hoplite::wire::kVersion;  // for tests and tools that speak the protocol by hand
  hoplite::registerGetErrorTranslator();

  py::class_<hoplite::GetWaiter>(m, "GetWaiter")
      .def("wait", &hoplite::GetWaiter::wait, py::arg("token"), py::arg("timeout"));
  py::class_<NodeHandle>(m, "Node")
      .def(py::init([](const py::dict& config) { return std::make_unique<NodeHandle>(configFromDict(config)); }))
      .def_property_readonly("host", [](NodeHandle& h) { return h.node().host(); })
      .def_property_readonly("port", [](NodeHandle& h) { return h.node().port(); })
      .def_property_readonly("host_identity", [](NodeHandle& h) { return h.node().hostIdentity(); })
      .def_property_readonly("rank", [](NodeHandle& h) { return h.node().rank(); })
      .def(
          "add_peer", [](NodeHandle& h, int rank, const std::string& host, int port) { h.node().addPeer(rank, host, port); },
          py::arg("rank"), py::arg("host"), py::arg("port"))
      .def("allreduce", &NodeHandle::allreduce, py::arg("id"), py::arg("members"), py::arg("tensor"), py::arg("op"),
           py::arg("timeout"))
      .def("put", &NodeHandle::put, py::arg("id"), py::arg("dtype"), py::arg("tensor"), py::arg("timeout"),
           py::arg("blocking"), py::arg("copy"))
      .def("get", &NodeHandle::get, py::arg("id"), py::arg("timeout"), py::arg("copy"), py::arg("future"),
           py::arg("out") = py::none(), py::arg("out_dtype") = "", py::arg("cuda_device") = -1,
           py::arg("source") = -1)
      .def("get_waiter", &NodeHandle::getWaiter)
      .def(
          "delete",
          [](NodeHandle& h, const std::vector<py::bytes>& ids, double timeout) {
            std::vector<std::string> keys(ids.begin(), ids.end());
            Status s;
            {
              py::gil_scoped_release release;
              s = h.node().remove(keys, timeout);
            }
            return py::make_tuple(static_cast<int>(s.code), s.message);
          },
          py::arg("ids"), py::arg("timeout"))
      .def("reduce", &reduce, py::arg("result_id"), py::arg("input_ids"), py::arg("count"), py::arg("op"),
           py::arg("degree"), py::arg("timeout"), py::arg("ordered") = false)
      .def("reduce_outcome", &reduceOutcome, py::arg("result_id"), py::arg("timeout"))
      .def(
          "announce",
          [](NodeHandle& h, double timeout) {
            Status s;
            {
              py::gil_scoped_release release;
              s = h.node().announce(timeout);
            }
            return py::make_tuple(static_cast<int>(s.code), s.message);
          },
          py::arg("timeout"))
      .def(
          "subscribe", [](NodeHandle& h, const py::bytes& id) { return h.node().subscriptions().subscribe(id); }, py::arg("id"))
      .def("next_locations", &nextLocations, py::arg("handle"), py::arg("seen"), py::arg("timeout"))
      .def(
          "unsubscribe", [](NodeHandle& h, uint64_t handle) { h.node().subscriptions().unsubscribe(handle); }, py::arg("handle"))
      .def("stats", [](NodeHandle& h) { return h.node().stats(); })
      .def("empty", &NodeHandle::empty, py::arg("numel"), py::arg("dtype"))
      .def("shutdown", &NodeHandle::shutdown);
  m.def("set_tracing", &hoplite::setTracing, py::arg("on"), "Record the steps of operations (torch_hoplite.trace_events).");
  m.def(
      "take_trace",
      [] {
        uint64_t dropped = 0;
        std::vector<hoplite::StepRecord> records = hoplite::takeTrace(&dropped);
        py::list steps;
        for (const auto& r : records) {
          steps.append(py::make_tuple(r.seconds, hoplite::stepName(r.step), py::bytes(r.id), r.peer, r.bytes));
        }
        return py::make_tuple(steps, dropped);
      },
      "The steps recorded since the last call, and how many were dropped (over the cap).");
  m.def("transports", &hoplite::transportNames, "Names of the transports this build has (HOPLITE_TRANSPORT).");
  m.def(
      "hmac_sha256",
      [](const py::bytes& key, const py::bytes& message) {
        auto d = hoplite::hmacSha256(key, message);
        return py::bytes(reinterpret_cast<const char*>(d.data()), d.size());
      },
      "HMAC-SHA256 of the handshake, exposed to test it against Python's hmac");
  hoplite::bindBackend(m);
}
