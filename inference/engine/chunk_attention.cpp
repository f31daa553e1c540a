// Causal attention of a prompt chunk over its slot's cache, for the CPU.
//
// A chunk's queries (its rows x the query heads sharing a KV head) sit in the lanes of a
// vector, so a score is a chain of multiply-adds over head_dim with one key element
// broadcast, and no horizontal sum; kKeys keys at a time keep that many chains in flight.
// Then a vectorised softmax per lane, and the weighted sum over the values with kSub
// queries' sums in registers. Late in a long prompt a chunk is a few rows over thousands of
// keys, where torch's fused kernel ran at ~50 GFLOP/s: 8 rows over 2,000 keys of a 30-layer
// bfloat16 cache took 10.3 ms against its 20.5 (docs/engine.md, "Prompt chunks in C++").
//
// A row's result depends on its own query, its keys (those up to its own position) and the
// keys' order only: its score is one lane's chain over head_dim, its softmax and its
// weighted sum run over the keys in key order, and a key past its position weighs exactly 0.
// So a prompt comes out the same bits however it is cut into chunks, and whatever the lanes
// beside its queries hold.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "attention_kernels.h"
#include "vector_rows.h"

namespace tandem {
namespace {

constexpr int64_t kKeys = 8;  // keys scored together: independent chains of multiply-adds
// Queries summed together: 6 x 4 accumulators at head_dim 64 with AVX-512's 32 registers; 2 x 8
// with AVX2's 16 (an AVX2 build on a Zen 4, 8 rows over 2,000 keys, 30 layers: 19.1 ms
// against 21.0 with 1 and 20.9 with 6; 512 rows from 0: 133.7 against 154.9 and 154.7).
constexpr int64_t kSub = fVec::size() >= 16 ? 6 : 2;

// V vectors per head when known at compile time (0: read from q). Each (KV head, tile of W
// queries) is one work item; scores for a tile are kept [key][lane] in `w`.
template <typename T, int64_t V>
void chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
           int64_t start, float scale, torch::Tensor& out) {
  constexpr int64_t W = fVec::size();
  const int64_t n = q.size(0), heads = q.size(1), groups = q.size(2), dim = q.size(3);
  const int64_t vecs = V ? V : dim / W;
  const int64_t queries = n * groups, tiles = (queries + W - 1) / W;
  const T* qp = q.const_data_ptr<T>();
  const T* kp = k.const_data_ptr<T>();
  const T* vp = v.const_data_ptr<T>();
  T* op = out.mutable_data_ptr<T>();
  const int64_t ks0 = k.stride(0), ks1 = k.stride(1), vs0 = v.stride(0), vs1 = v.stride(1);
  const float minus_inf = -std::numeric_limits<float>::infinity();
  at::parallel_for(0, heads * tiles, 1, [&](int64_t begin, int64_t end) {
    // Scores have room for a whole last block of keys and the value pass's widest read.
    std::vector<float> qt(dim * W), kf(kKeys * dim), w((start + n + kKeys) * W + kSub);
    std::vector<float> sums(kSub * dim);
    fVec row[kMaxVecs];
    float totals[W];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / tiles, first = item % tiles * W;
      const int64_t lanes = std::min(W, queries - first);
      const int64_t last_row = (first + lanes - 1) / groups;
      const int64_t keys = start + last_row + 1;
      const T* kh = kp + h * ks0;
      const T* vh = vp + h * vs0;
      auto row_of = [&](int64_t lane) { return lane < lanes ? (first + lane) / groups : last_row; };
      auto out_of = [&](int64_t lane) {
        const int64_t index = first + lane;
        return op + ((index / groups * heads + h) * groups + index % groups) * dim;
      };
      std::fill(qt.begin(), qt.end(), 0.0f);
      for (int64_t lane = 0; lane < lanes; ++lane) {
        const int64_t index = first + lane;
        const T* src = qp + ((index / groups * heads + h) * groups + index % groups) * dim;
        for (int64_t d = 0; d < dim; ++d) qt[d * W + lane] = static_cast<float>(src[d]);
      }
      // Every accumulator is stored whatever the block's size: indexed by a count known only
      // at run time, the compiler kept them in memory, a store per multiply-add (8 rows over
      // 2,000 keys, 30 layers: 24.8 against 10.2 ms).
      for (int64_t l0 = 0; l0 < keys; l0 += kKeys) {
        for (int64_t b = 0; b < std::min(kKeys, keys - l0); ++b) {
          load_float(kh + (l0 + b) * ks1, row, vecs);
          store(kf.data() + b * dim, row, vecs);
        }
        fVec acc[kKeys];
        for (int64_t b = 0; b < kKeys; ++b) acc[b] = fVec(0.0f);
        for (int64_t d = 0; d < dim; ++d) {
          const fVec query = fVec::loadu(qt.data() + d * W);
          for (int64_t b = 0; b < kKeys; ++b) {
            acc[b] = at::vec::fmadd(query, fVec(kf[b * dim + d]), acc[b]);
          }
        }
        for (int64_t b = 0; b < kKeys; ++b) (acc[b] * fVec(scale)).store(w.data() + (l0 + b) * W);
      }
      for (int64_t lane = 0; lane < W; ++lane) {
        for (int64_t l = start + row_of(lane) + 1; l < keys; ++l) w[l * W + lane] = minus_inf;
      }
      fVec top(minus_inf), total(0.0f);
      for (int64_t l = 0; l < keys; ++l) top = at::vec::maximum(top, fVec::loadu(w.data() + l * W));
      for (int64_t l = 0; l < keys; ++l) {
        const fVec weight = (fVec::loadu(w.data() + l * W) - top).exp();
        weight.store(w.data() + l * W);
        total = total + weight;
      }
      total.store(totals);
      for (int64_t s0 = 0; s0 < lanes; s0 += kSub) {
        const int64_t subs = std::min(kSub, lanes - s0);
        const int64_t sub_keys = start + row_of(s0 + subs - 1) + 1;
        fVec sum[kSub][V ? V : kMaxVecs];
        for (int64_t s = 0; s < kSub; ++s) {
          for (int64_t j = 0; j < vecs; ++j) sum[s][j] = fVec(0.0f);
        }
        for (int64_t l = 0; l < sub_keys; ++l) {
          load_float(vh + l * vs1, row, vecs);
          const float* weights = w.data() + l * W + s0;
          for (int64_t s = 0; s < kSub; ++s) {
            const fVec weight(weights[s]);
            for (int64_t j = 0; j < vecs; ++j) sum[s][j] = at::vec::fmadd(weight, row[j], sum[s][j]);
          }
        }
        for (int64_t s = 0; s < kSub; ++s) store(sums.data() + s * dim, sum[s], vecs);
        for (int64_t s = 0; s < subs; ++s) {
          load_float(sums.data() + s * dim, row, vecs);
          const fVec inverse(1.0f / totals[s0 + s]);
          for (int64_t j = 0; j < vecs; ++j) row[j] = row[j] * inverse;
          store(out_of(s0 + s), row, vecs);
        }
      }
    }
  });
}

template <typename T>
void chunk_shaped(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                  int64_t start, float scale, torch::Tensor& out) {
  constexpr int64_t kVecs = 64 / fVec::size();
  if (q.size(3) == 64) {
    chunk<T, kVecs>(q, k, v, start, scale, out);
  } else {
    chunk<T, 0>(q, k, v, start, scale, out);
  }
}

}  // namespace

torch::Tensor chunk_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, int64_t start, double scale) {
  check_chunk(q, k, v, start);
  TORCH_CHECK(q.size(3) % fVec::size() == 0 && q.size(3) <= kMaxVecs * fVec::size(), "head_dim");
  auto out = torch::empty_like(q);
  if (q.scalar_type() == torch::kBFloat16) {
    chunk_shaped<at::BFloat16>(q, k, v, start, static_cast<float>(scale), out);
  } else {
    TORCH_CHECK(q.scalar_type() == torch::kFloat, "float32 or bfloat16");
    chunk_shaped<float>(q, k, v, start, static_cast<float>(scale), out);
  }
  return out;
}

}  // namespace tandem
