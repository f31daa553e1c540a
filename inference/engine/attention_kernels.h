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

// The same on AMX tiles (chunk_tiles.cpp): bfloat16, head_dim 32 or 64, where tiles_ready().
torch::Tensor chunk_attention_tiles(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, int64_t start, double scale);

// Whether this CPU has AMX's bfloat16 tiles and this process may use them (asked once).
bool tiles_ready();

}  // namespace tandem
