// The weight kernels' entry points, bound to Python in bindings.cpp.

#pragma once

#include <torch/extension.h>

namespace tandem {

// x [rows, in] float32 or bfloat16, contiguous, in a multiple of 32; weight int8 [out, in]
// contiguous, in tiles of q8_tile() rows (q8_linear.cpp says how); scales float32 [out].
// Returns [rows, out] in x's dtype.
torch::Tensor q8_linear(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& scales);

// The matrices `tandem::q8_linear(x, handle, out_features)` multiplies by, the op the compiled
// step calls (registered in q8_linear.cpp, so no call takes the GIL).
void q8_register(int64_t handle, const torch::Tensor& weight, const torch::Tensor& scales);
void q8_release(int64_t handle);

// x as for q8_linear; weight uint8 [out, in / 32 · 24], GGUF Q4_1 blocks with float32 d and m
// (q4_1_linear.cpp). Returns [rows, out] in x's dtype.
torch::Tensor q4_1_linear(const torch::Tensor& x, const torch::Tensor& weight);

// The matrices `tandem::q4_1_linear(x, handle, out_features)` multiplies by.
void q4_1_register(int64_t handle, const torch::Tensor& weight);
void q4_1_release(int64_t handle);

// The output rows of a tile of q8_linear's weight layout.
int64_t q8_tile();

// The instructions q8_linear and q4_1_linear were built for: avx512_vnni, avx512bw, avx2 or scalar.
const char* q8_instructions();

}  // namespace tandem
