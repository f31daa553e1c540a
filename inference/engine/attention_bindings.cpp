// The C++ attention kernels as one Python module (native_attention.py builds and loads it).

#include "attention_kernels.h"
#include "vector_rows.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &tandem::decode_attention, py::call_guard<py::gil_scoped_release>());
  m.def("chunk_attention", &tandem::chunk_attention, py::call_guard<py::gil_scoped_release>());
  m.attr("vector_width") = tandem::fVec::size();
  m.attr("max_groups") = tandem::kMaxGroups;
  m.attr("max_vectors") = tandem::kMaxVecs;
}
