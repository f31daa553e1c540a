// Rows of activations rounded to int8 per block of 32 (llama.cpp's Q8_0 / Q8_1 activations),
// and the loop over tiles of output rows that the int8 weight kernels share (q8_linear.cpp,
// q4_1_linear.cpp).

#pragma once

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace tandem {

constexpr int64_t kBlock = 32;

inline float to_float(float v) { return v; }
inline float to_float(at::BFloat16 v) { return static_cast<float>(v); }

// One row of K values to int8 per block of 32: q = round(x / d), d = max |x| / 127. With
// `sums`, each block's d · Σq too: a Q4_1 weight's minimum multiplies the block's sum.
template <typename T>
void quantize_row(const T* x, int64_t k, int8_t* q, float* scales, float* sums = nullptr) {
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const T* block = x + b * kBlock;
    float amax = 0.f;
    for (int64_t i = 0; i < kBlock; ++i) amax = std::max(amax, std::fabs(to_float(block[i])));
    const float d = amax / 127.f;
    const float inverse = d > 0.f ? 1.f / d : 0.f;
    int32_t total = 0;
    for (int64_t i = 0; i < kBlock; ++i) {
      const auto value = static_cast<int8_t>(std::nearbyint(to_float(block[i]) * inverse));
      q[b * kBlock + i] = value;
      total += value;
    }
    scales[b] = d;
    if (sums != nullptr) sums[b] = d * static_cast<float>(total);
  }
}


// Every row of x [m, k] as int8 blocks: q [m, k], scales and (when asked) sums [m, k / 32].
struct ActivationBlocks {
  int64_t k, blocks;
  std::vector<int8_t> q;
  std::vector<float> scales, sums;

  template <typename T>
  ActivationBlocks(const T* x, int64_t m, int64_t k, bool with_sums)
      : k(k), blocks(k / kBlock), q(m * k), scales(m * blocks), sums(with_sums ? m * blocks : 0) {
    for (int64_t row = 0; row < m; ++row) {
      quantize_row(x + row * k, k, q.data() + row * k, scales.data() + row * blocks,
                   with_sums ? sums.data() + row * blocks : nullptr);
    }
  }

  const int8_t* row_q(int64_t row) const { return q.data() + row * k; }
  const float* row_scales(int64_t row) const { return scales.data() + row * blocks; }
  const float* row_sums(int64_t row) const { return sums.data() + row * blocks; }
};

// y [m, n] in tasks of `Tile` output rows: `tile(row, xs, first, rows, dots)` writes dots[x][r]
// for x's rows row .. row + xs - 1 (xs <= Group) and output rows first .. first + rows - 1. A
// tile's weights stay in L1 for the next rows of x.
template <int64_t Tile, int64_t Group, typename T, typename DotTile>
void over_tiles(int64_t m, int64_t n, T* y, const DotTile& tile) {
  const int64_t tiles = (n + Tile - 1) / Tile;
  at::parallel_for(0, tiles, 8, [&](int64_t begin, int64_t end) {
    float dots[Group][Tile];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t first = t * Tile;
      const int64_t rows = std::min(Tile, n - first);
      for (int64_t row = 0; row < m; row += Group) {
        const int64_t xs = std::min(Group, m - row);
        tile(row, xs, first, rows, dots);
        for (int64_t x = 0; x < xs; ++x) {
          for (int64_t r = 0; r < rows; ++r) {
            y[(row + x) * n + first + r] = static_cast<T>(dots[x][r]);
          }
        }
      }
    }
  });
}

#if defined(__AVX2__)
inline float sum_lanes(__m256 v) {
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  half = _mm_add_ps(half, _mm_movehl_ps(half, half));
  half = _mm_add_ss(half, _mm_movehdup_ps(half));
  return _mm_cvtss_f32(half);
}
#endif

}  // namespace tandem
