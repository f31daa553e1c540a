// The attention kernels' entry points and limits, bound to Python in bindings.cpp.

#pragma once

#include <torch/extension.h>

namespace tandem {

constexpr int64_t kMaxGroups = 16;  // query heads per KV head decode_attention takes
constexpr int64_t kMaxVecs = 16;    // vectors of floats in a head_dim, for both kernels

// q [n, kv_heads, groups, head_dim] contiguous; k, v [n, kv_heads, keys, head_dim] with
// head_dim contiguous (views of the cache); mask [n or 1, 1, 1, keys] additive (0 or -inf).
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& mask, double scale);

// One prompt chunk of n rows at positions start .. start + n - 1: q [n, kv_heads, groups,
// head_dim] contiguous; k, v [kv_heads, keys >= start + n, head_dim] (its slot's cache) with
// head_dim contiguous. Row r attends keys 0 .. start + r.
torch::Tensor chunk_attention(const torch::Tensor& q, const torch::Tensor& k,
                              const torch::Tensor& v, int64_t start, double scale);

// What both prompt-chunk kernels take: the shapes and layout above, one dtype for all three.
inline void check_chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        int64_t start) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 3 && v.dim() == 3, "q 4-d, k and v 3-d");
  TORCH_CHECK(q.is_contiguous() && k.stride(2) == 1 && v.stride(2) == 1, "layout");
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == q.size(1) && k.size(2) == q.size(3) &&
                  start >= 0 && k.size(1) >= start + q.size(0),
              "shapes");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "one dtype");
}

// The same on AMX tiles (chunk_tiles.cpp): bfloat16, head_dim 32 or 64, where tiles_ready().
torch::Tensor chunk_attention_tiles(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, int64_t start, double scale);

// Whether this CPU has AMX's bfloat16 tiles and this process may use them (asked once).
bool tiles_ready();

}  // namespace tandem
