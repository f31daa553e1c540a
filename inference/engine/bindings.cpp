// The C++ kernels as one Python module (native_build.py builds and loads it): attention
// (decode rows, prompt chunks in vectors or on AMX tiles), the compiled step's attention op
// and the int8 weight kernels (q8, q4_1).

#include "attention_kernels.h"
#include "linear_kernels.h"
#include "step_attention.h"
#include "vector_rows.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &tandem::decode_attention, py::call_guard<py::gil_scoped_release>());
  m.def("chunk_attention", &tandem::chunk_attention, py::call_guard<py::gil_scoped_release>());
  m.def("chunk_attention_tiles", &tandem::chunk_attention_tiles,
        py::call_guard<py::gil_scoped_release>());
  m.def("tiles_ready", &tandem::tiles_ready);
  py::class_<tandem::ArrivalFlag>(m, "ArrivalFlag")
      .def(py::init<>())
      .def("set", &tandem::ArrivalFlag::set)
      .def("clear", &tandem::ArrivalFlag::clear)
      .def("is_set", &tandem::ArrivalFlag::is_set);
  m.def("step_begin", &tandem::step_begin);
  m.def("step_begin_view", &tandem::step_begin_view);
  m.def("step_end", &tandem::step_end);
  m.def("q8_linear", &tandem::q8_linear, py::call_guard<py::gil_scoped_release>());
  m.def("q8_register", &tandem::q8_register);
  m.def("q8_release", &tandem::q8_release);
  m.def("q4_1_linear", &tandem::q4_1_linear, py::call_guard<py::gil_scoped_release>());
  m.def("q4_1_register", &tandem::q4_1_register);
  m.def("q4_1_release", &tandem::q4_1_release);
  m.attr("q8_instructions") = tandem::q8_instructions();
  m.attr("q8_tile") = tandem::q8_tile();
  m.attr("vector_width") = tandem::fVec::size();
  m.attr("max_groups") = tandem::kMaxGroups;
  m.attr("max_vectors") = tandem::kMaxVecs;
}
