// module.cpp — ruccl_pg._C: the Python face of the shim.  ruccl_pg/__init__.py
// registers `ruccl` with torch.distributed and calls create_backend from there.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "ProcessGroupRuccl.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "ruCCL's torch.distributed backend (C++ shim over the ruCCL C core)";
  py::module_::import("torch.distributed");
  py::class_<ruccl_torch::ProcessGroupRuccl, c10d::Backend, c10::intrusive_ptr<ruccl_torch::ProcessGroupRuccl>>(
      m, "ProcessGroupRuccl")
      .def("_set_default_timeout", &ruccl_torch::ProcessGroupRuccl::setTimeout, py::arg("timeout"),
           py::call_guard<py::gil_scoped_release>(),
           "The timeout of later ops (as gloo's and NCCL's backends take it).");
  m.def(
      "create_backend",
      [](const c10::intrusive_ptr<c10d::Store> &store, int rank, int size, std::chrono::milliseconds timeout,
         const std::string &group_id, const std::string &node_address) {
        ruccl_torch::RucclOptions o;
        o.store = store;
        o.rank = rank;
        o.size = size;
        o.timeout = timeout;
        o.group_id = group_id;
        o.node_address = node_address;
        return c10::make_intrusive<ruccl_torch::ProcessGroupRuccl>(o);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("group_id"),
      py::arg("node_address"), py::call_guard<py::gil_scoped_release>(),
      "Registers this process as rank `rank` of `size` (a blocking rendezvous through `store`).");
  m.def(
      "built_with_cuda",
      [] {
#ifdef RUCCL_TORCH_CUDA
        return true;
#else
        return false;
#endif
      },
      "Whether this extension (and the core it links) was built with CUDA: CUDA tensors then go to the core "
      "as they are; otherwise they are copied through host memory.");
  m.def(
      "dump_trace",
      [](const std::string &dir, const std::string &reason) {
        return ruccl_torch::FlightRecorder::get().dump(dir, reason);
      },
      py::arg("dir"), py::arg("reason"), py::call_guard<py::gil_scoped_release>(),
      "Writes this process's flight recorder to dir (empty: RUCCL_TRACE_DIR); returns the file's path.");
  m.def("version", [] {
    return std::to_string(RUCCL_VERSION_MAJOR) + "." + std::to_string(RUCCL_VERSION_MINOR) + "." +
           std::to_string(RUCCL_VERSION_PATCH);
  });
}
