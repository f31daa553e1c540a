// The compiled step's attention op, `tandem::step_attention(q, kv, layer)`, in C++: a graph
// calls it 30 times a step, and as a Python op each call took the GIL and ~60 µs of Python
// around a kernel of ~20 (one row, 2-core AMD EPYC Zen 3); in a web process the GIL is the
// event loop's half the time, so every layer could wait for it.
//
// The step's context (step_attention.py) is set on the engine's thread before the graph
// runs. The commonest step, decode rows only in slots 0 .. n - 1 read through one view of the
// cache, runs here without the GIL: the rows' K/V written into the cache, then the decode
// kernel. Any other step, or one a newcomer may cut into (a request arrived since the plan:
// the `ArrivalFlag`), calls the step's Python `attend` under the GIL, as the Python op did.

#include <torch/extension.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "attention_kernels.h"
#include "step_attention.h"

namespace tandem {
namespace {

// The view step: everything every layer shares, worked out once a step.
struct ViewStep {
  torch::Tensor storage;     // [layers, 2, slots, kv_heads, capacity, head_dim]
  torch::Tensor cache_rows;  // the rows' K/V rows in a layer's storage viewed [-1, head_dim]
  torch::Tensor mask;        // additive [span, 1, 1, longest]
  int64_t span = 0;
  int64_t longest = 0;
  int64_t groups = 0;
  double scale = 1.0;
};

struct Context {
  int64_t rows = 0;  // the step's real rows; the graph's bucket pads the rest
  bool has_view = false;
  ViewStep view;
  const ArrivalFlag* arrivals = nullptr;  // set when a newcomer may cut into the step
  py::object python;                      // attend(q, kv, layer) in Python
};

// A stack: a newcomer's step runs inside the step it cut into, on the same thread.
thread_local std::vector<Context> contexts;

torch::Tensor view_attend(const Context& context, const torch::Tensor& q,
                          const torch::Tensor& kv, int64_t layer) {
  const ViewStep& step = context.view;
  const torch::Tensor stored = step.storage.select(0, layer);
  const auto dtype = stored.scalar_type();
  const int64_t head_dim = stored.size(-1), kv_heads = stored.size(2);
  torch::Tensor rows_q = q.narrow(0, 0, context.rows), rows_kv = kv.narrow(0, 0, context.rows);
  if (q.scalar_type() != dtype) {
    rows_q = rows_q.to(dtype);
    rows_kv = rows_kv.to(dtype);
  }
  stored.view({-1, head_dim}).index_copy_(0, step.cache_rows, rows_kv.reshape({-1, head_dim}));
  const torch::Tensor keys = stored.select(0, 0).narrow(0, 0, step.span).narrow(2, 0, step.longest);
  const torch::Tensor values =
      stored.select(0, 1).narrow(0, 0, step.span).narrow(2, 0, step.longest);
  const torch::Tensor grouped =
      rows_q.contiguous().view({step.span, kv_heads, step.groups, head_dim});
  torch::Tensor out =
      decode_attention(grouped, keys, values, step.mask, step.scale).view({step.span, -1});
  if (q.scalar_type() != dtype) out = out.to(q.scalar_type());
  if (context.rows == q.size(0)) return out;
  return torch::cat({out, out.new_zeros({q.size(0) - context.rows, out.size(1)})});
}

torch::Tensor python_attend(const Context& context, const torch::Tensor& q,
                            const torch::Tensor& kv, int64_t layer) {
  py::gil_scoped_acquire gil;
  try {
    return context.python(q, kv, layer).cast<torch::Tensor>();
  } catch (py::error_already_set& error) {
    // The Python side kept the exception for run_stack; the graph needs a C++ one.
    throw std::runtime_error(error.what());
  }
}

torch::Tensor step_attention(const torch::Tensor& q, const torch::Tensor& kv, int64_t layer) {
  TORCH_CHECK(!contexts.empty(), "tandem::step_attention called outside a step");
  const Context& context = contexts.back();
  const bool cut_in = context.arrivals != nullptr && context.arrivals->is_set();
  if (context.has_view && !cut_in) return view_attend(context, q, kv, layer);
  return python_attend(context, q, kv, layer);
}

}  // namespace

void ArrivalFlag::set() { value_.store(true, std::memory_order_relaxed); }
void ArrivalFlag::clear() { value_.store(false, std::memory_order_relaxed); }
bool ArrivalFlag::is_set() const { return value_.load(std::memory_order_relaxed); }

void step_begin(int64_t rows, py::object python, const ArrivalFlag* arrivals) {
  Context context;
  context.rows = rows;
  context.python = std::move(python);
  context.arrivals = arrivals;
  contexts.push_back(std::move(context));
}

void step_begin_view(int64_t rows, py::object python, const ArrivalFlag* arrivals,
                     const torch::Tensor& storage, const torch::Tensor& cache_rows,
                     const torch::Tensor& mask, int64_t span, int64_t longest, int64_t groups,
                     double scale) {
  TORCH_CHECK(span == rows, "step_attention: a view step's rows are its slots 0 .. n - 1");
  step_begin(rows, std::move(python), arrivals);
  ViewStep& view = contexts.back().view;
  view.storage = storage;
  view.cache_rows = cache_rows;
  view.mask = mask;
  view.span = span;
  view.longest = longest;
  view.groups = groups;
  view.scale = scale;
  contexts.back().has_view = true;
}

void step_end() {
  TORCH_CHECK(!contexts.empty(), "step_end without step_begin");
  contexts.pop_back();
}

}  // namespace tandem

TORCH_LIBRARY_FRAGMENT(tandem, m) {
  m.def("step_attention(Tensor q, Tensor kv, int layer) -> Tensor");
}

TORCH_LIBRARY_IMPL(tandem, CPU, m) { m.impl("step_attention", &tandem::step_attention); }
