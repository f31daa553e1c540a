// Rows of a cache or a query as float32 vectors, and back: what the attention kernels read
// and write (decode_attention.cpp, chunk_attention.cpp), for float32 and bfloat16.

#pragma once

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

namespace tandem {

using at::vec::Vectorized;
using fVec = Vectorized<float>;

inline void load_float(const float* src, fVec* dst, int64_t vecs) {
  for (int64_t j = 0; j < vecs; ++j) dst[j] = fVec::loadu(src + j * fVec::size());
}

inline void load_float(const at::BFloat16* src, fVec* dst, int64_t vecs) {
  int64_t j = 0;
  for (; j + 1 < vecs; j += 2) {
    auto [low, high] = at::vec::convert_to_float<at::BFloat16>(
        Vectorized<at::BFloat16>::loadu(src + j * fVec::size()));
    dst[j] = low;
    dst[j + 1] = high;
  }
  if (j < vecs) {
    auto [low, high] = at::vec::convert_to_float<at::BFloat16>(
        Vectorized<at::BFloat16>::loadu(src + j * fVec::size(), fVec::size()));
    dst[j] = low;
  }
}

inline void store(float* dst, const fVec* src, int64_t vecs) {
  for (int64_t j = 0; j < vecs; ++j) src[j].store(dst + j * fVec::size());
}

inline void store(at::BFloat16* dst, const fVec* src, int64_t vecs) {
  int64_t j = 0;
  for (; j + 1 < vecs; j += 2) {
    at::vec::convert_from_float<at::BFloat16>(src[j], src[j + 1]).store(dst + j * fVec::size());
  }
  if (j < vecs) {
    at::vec::convert_from_float<at::BFloat16>(src[j], fVec(0.0f))
        .store(dst + j * fVec::size(), fVec::size());
  }
}

}  // namespace tandem
