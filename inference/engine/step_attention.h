// The compiled step's attention op and its per-step context (step_attention.cpp), bound to
// Python in bindings.cpp.

#pragma once

#include <torch/extension.h>

#include <atomic>

namespace tandem {

// Whether a request was submitted since the engine last planned a step: the op reads it
// between layers without the GIL, and takes the Python path (a newcomer may cut in) when set.
class ArrivalFlag {
 public:
  void set();
  void clear();
  bool is_set() const;

 private:
  std::atomic<bool> value_{false};
};

// A step's context on this thread, until step_end: `rows` real rows, `python` the step's
// attend(q, kv, layer), `arrivals` the engine's flag where a newcomer may cut in (else None).
void step_begin(int64_t rows, py::object python, const ArrivalFlag* arrivals);

// The same for a view step (decode rows in slots 0 .. rows - 1): `storage` the cache
// [layers, 2, slots, kv_heads, capacity, head_dim], `cache_rows` where the rows' K/V go in a
// layer viewed [-1, head_dim], `mask` additive [rows, 1, 1, longest].
void step_begin_view(int64_t rows, py::object python, const ArrivalFlag* arrivals,
                     const torch::Tensor& storage, const torch::Tensor& cache_rows,
                     const torch::Tensor& mask, int64_t span, int64_t longest, int64_t groups,
                     double scale);

void step_end();

}  // namespace tandem
