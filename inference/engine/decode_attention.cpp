// Grouped decode attention for the CPU: each (sequence, KV head) reads its keys and values
// once for the query heads sharing them, in float32, one pass for the scores and one for the
// weighted sum (inference/engine/native_attention.py says why it exists and how it is built).
//
// A row's result depends on nothing but its own query, keys and mask: rows are independent,
// keys are summed in key order, and masked keys (weight exactly 0) are skipped, so a longer
// companion or a longer view adds nothing. Batch invariance holds bit for bit at every row
// count, one row included.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "attention_kernels.h"
#include "vector_rows.h"

namespace tandem {
namespace {

// Rows a pass asks the memory for ahead of the one it reads. The cache sits on 4 KiB pages
// (kv_cache.py, `zero_pages`), and the hardware's prefetchers stop at a page's end; asked
// 8 rows ahead, 31 rows over 320 / 1,024 keys of a 30-layer float32 cache took 23.9 / 73.3
// against 30.2 / 88.1 ms with 2 threads, 42.4 / 123.2 against 53.2 / 149.7 with 1 (medians
// of 9 interleaved, 2-core AMD EPYC Zen 3, 2026-12-03).
// A pass also asks for the first rows of what comes next (the values' at the end of the
// scores, the next pair's keys at the start of a pair), where the pass ahead would not:
// 31 rows over 64 / 320 keys 4.40 / 14.87 against 4.99 / 15.93 ms, one row over 1,920 keys
// 3.23 against 3.89 (bfloat16, 2 threads, medians of 11 interleaved, 2-core AMD EPYC Zen 4,
// 2026-12-04).
constexpr int64_t kPrefetchRows = 8;

template <typename T>
inline void prefetch_row(const T* row, int64_t dim) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t byte = 0; byte < dim * static_cast<int64_t>(sizeof(T)); byte += 64) {
    __builtin_prefetch(bytes + byte);
  }
}

template <typename T>
inline void prefetch_ahead(const T* rows, int64_t l, int64_t keys, int64_t stride, int64_t dim) {
  if (l + kPrefetchRows < keys) prefetch_row(rows + (l + kPrefetchRows) * stride, dim);
}

template <typename T>
inline void prefetch_first(const T* rows, int64_t keys, int64_t stride, int64_t dim) {
  for (int64_t l = 0; l < std::min(kPrefetchRows, keys); ++l) prefetch_row(rows + l * stride, dim);
}

// G query heads per KV head and V vectors per head, when known at compile time (0: read from
// q). Known, the loops can unroll and keep a head's queries and sums in registers. Read at
// run time, 31 rows over 320 / 1,024 keys of a 30-layer bfloat16 cache took 28.9 / 86.0 ms
// against 14.8 / 42.1, one row over 576 keys 2.20 against 1.54 (2 threads, medians of 11
// interleaved, 2-core AMD EPYC Zen 4, 2026-12-04). Same arithmetic in the same order: the
// results are bit for bit those of the run-time loops.
template <typename T, int64_t G, int64_t V>
void attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
            const torch::Tensor& mask, float scale, torch::Tensor& out) {
  const int64_t n = q.size(0), heads = q.size(1), groups = G ? G : q.size(2), dim = q.size(3);
  const int64_t keys = k.size(2), vecs = V ? V : dim / fVec::size();
  const T* qp = q.const_data_ptr<T>();
  const T* kp = k.const_data_ptr<T>();
  const T* vp = v.const_data_ptr<T>();
  const T* mp = mask.const_data_ptr<T>();
  T* op = out.mutable_data_ptr<T>();
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), ks2 = k.stride(2);
  const int64_t vs0 = v.stride(0), vs1 = v.stride(1), vs2 = v.stride(2);
  const int64_t ms0 = mask.size(0) == 1 ? 0 : mask.stride(0), ms3 = mask.stride(3);
  at::parallel_for(0, n * heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> weights(groups * keys);
    fVec query[kMaxGroups][kMaxVecs];
    fVec sum[kMaxGroups][kMaxVecs];
    fVec row[kMaxVecs];
    float total[kMaxGroups];
    auto keys_of = [&](int64_t index) { return kp + index / heads * ks0 + index % heads * ks1; };
    prefetch_first(keys_of(begin), keys, ks2, dim);
    for (int64_t index = begin; index < end; ++index) {
      const int64_t i = index / heads, h = index % heads;
      const T* kr = keys_of(index);
      const T* vr = vp + i * vs0 + h * vs1;
      const T* mr = mp + i * ms0;
      const T* qr = qp + index * groups * dim;
      if (index + 1 < end) prefetch_first(keys_of(index + 1), keys, ks2, dim);
      for (int64_t g = 0; g < groups; ++g) load_float(qr + g * dim, query[g], vecs);
      for (int64_t l = 0; l < keys; ++l) {
        prefetch_ahead(kr, l, keys, ks2, dim);
        load_float(kr + l * ks2, row, vecs);
        const float bias = static_cast<float>(mr[l * ms3]);
        for (int64_t g = 0; g < groups; ++g) {
          fVec dot = query[g][0] * row[0];
          for (int64_t j = 1; j < vecs; ++j) dot = at::vec::fmadd(query[g][j], row[j], dot);
          weights[g * keys + l] =
              at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, dot) *
                  scale +
              bias;
        }
      }
      prefetch_first(vr, keys, vs2, dim);
      for (int64_t g = 0; g < groups; ++g) {
        float* w = weights.data() + g * keys;
        const float top = at::vec::reduce_all<float>(
            [](fVec& a, fVec& b) { return at::vec::maximum(a, b); }, w, keys);
        at::vec::map([top](fVec x) { return (x - fVec(top)).exp(); }, w, w, keys);
        total[g] = at::vec::reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, w, keys);
        for (int64_t j = 0; j < vecs; ++j) sum[g][j] = fVec(0.0f);
      }
      for (int64_t l = 0; l < keys; ++l) {
        bool seen = false;
        for (int64_t g = 0; g < groups; ++g) seen |= weights[g * keys + l] != 0.0f;
        prefetch_ahead(vr, l, keys, vs2, dim);
        if (!seen) continue;
        load_float(vr + l * vs2, row, vecs);
        for (int64_t g = 0; g < groups; ++g) {
          const fVec weight(weights[g * keys + l]);
          for (int64_t j = 0; j < vecs; ++j) sum[g][j] = at::vec::fmadd(weight, row[j], sum[g][j]);
        }
      }
      for (int64_t g = 0; g < groups; ++g) {
        const fVec inverse(1.0f / total[g]);
        for (int64_t j = 0; j < vecs; ++j) sum[g][j] = sum[g][j] * inverse;
        store(op + (index * groups + g) * dim, sum[g], vecs);
      }
    }
  });
}

// The loops for SmolLM2's heads (3 query heads a KV head, head_dim 64) with their sizes fixed;
// any other model's read at run time.
template <typename T>
void attend_shaped(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                   const torch::Tensor& mask, float scale, torch::Tensor& out) {
  constexpr int64_t kVecs = 64 / fVec::size();
  if (q.size(2) == 3 && q.size(3) == 64) {
    attend<T, 3, kVecs>(q, k, v, mask, scale, out);
  } else {
    attend<T, 0, 0>(q, k, v, mask, scale, out);
  }
}

}  // namespace

torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& mask, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && mask.dim() == 4, "4-d tensors");
  TORCH_CHECK(q.is_contiguous() && k.stride(3) == 1 && v.stride(3) == 1, "layout");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(0) && k.size(1) == q.size(1) &&
                  k.size(3) == q.size(3) && mask.size(3) == k.size(2),
              "shapes");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type() &&
                  mask.scalar_type() == q.scalar_type(),
              "one dtype");
  TORCH_CHECK(q.size(2) <= kMaxGroups && q.size(3) % fVec::size() == 0 &&
                  q.size(3) <= kMaxVecs * fVec::size(),
              "groups or head_dim");
  auto out = torch::empty_like(q);
  if (q.scalar_type() == torch::kBFloat16) {
    attend_shaped<at::BFloat16>(q, k, v, mask, static_cast<float>(scale), out);
  } else {
    TORCH_CHECK(q.scalar_type() == torch::kFloat, "float32 or bfloat16");
    attend_shaped<float>(q, k, v, mask, static_cast<float>(scale), out);
  }
  return out;
}

}  // namespace tandem
