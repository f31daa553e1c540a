// y = x Wᵀ with W as GGUF Q4_1 holds it and int8 activations, llama.cpp's scheme: a weight is
// w = d·q + m per block of 32 along a row (q in 0..15, d and m the block's scale and minimum),
// each row of x is rounded to int8 per block with a scale dx and the sum of the block's x
// kept (Q8_1), so a block's dot is d·dx·Σ q·qx + m·(dx·Σ qx). The products Σ q·qx run in int32
// (`vpdpbusd` on AVX-512 VNNI, `vpmaddubsw` + `vpmaddwd` otherwise): the nibbles are unsigned,
// the activations signed, as those instructions take them. weights/q4_1.py says why it exists.
//
// A row's blocks are 24 bytes: float32 d, float32 m, then 16 bytes whose low nibbles are the
// block's first 16 q and high nibbles its last 16 (the GGUF's order; its fp16 d and m are
// widened once at load, which keeps the inner loop free of conversions).
//
// A tile of output rows runs on up to 4 rows of x at once (2 on AVX2), so its nibbles are
// unpacked once for them; a (row, output) sum runs in one order whatever the rows beside it,
// so a request's result is the same alone and in a batch, one row included.

#include <torch/extension.h>
#include <torch/library.h>

#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "activation_blocks.h"
#include "linear_kernels.h"
#include "matrix_registry.h"

namespace tandem {
namespace {

constexpr int64_t kBlockBytes = 24;
constexpr int64_t kNibbles = 8;  // where a block's nibbles start
constexpr int64_t kTile = 4;
#ifndef AHEAD
#define AHEAD 8
#endif
constexpr int64_t kAhead = AHEAD;

inline float read_float(const uint8_t* at) {
  float value;
  std::memcpy(&value, at, sizeof value);
  return value;
}

// Σ_b m_b · sums_b, the minimum's term of one (row, output), m_b at `m + b · stride`: eight
// running sums (b mod 8, independent chains), added in a fixed order, so every path that
// calls it gets the same bits.
inline float minimum_term(const uint8_t* m, int64_t stride, const float* sums, int64_t blocks) {
  float part[8] = {};
  for (int64_t b = 0; b < blocks; ++b) {
    part[b % 8] = std::fma(read_float(m + b * stride), sums[b], part[b % 8]);
  }
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

#if defined(__AVX512BW__)
// Blocks b and b + 1 of a row as 64 unsigned bytes in x's order: b's first 16 q, its last 16,
// then b + 1's (without `Pair`, zeros in b + 1's place).
template <bool Pair>
inline __m512i nibble_pair(const uint8_t* block) {
  const __m128i first = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kNibbles));
  const __m128i second =
      Pair ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kBlockBytes + kNibbles))
           : _mm_setzero_si128();
  const __m512i both = _mm512_castsi256_si512(_mm256_set_m128i(second, first));
  const __m512i spread = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), both);
  // 16-bit lanes 8-15 and 24-31 (the high halves' copies) shift by 4, the others by 0.
  const __m512i shifts = _mm512_setr_epi64(0, 0, 0x0004000400040004, 0x0004000400040004, 0, 0,
                                           0x0004000400040004, 0x0004000400040004);
  return _mm512_and_si512(_mm512_srlv_epi16(spread, shifts), _mm512_set1_epi8(0x0F));
}

// Σ q·qx per block: 16 int32 lanes, the first 8 block b's.
inline __m512i block_pair(__m512i nibbles, __m512i x) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), nibbles, x);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(nibbles, x), _mm512_set1_epi16(1));
#endif
}

constexpr int64_t kGroup = 4;  // rows of x a tile's nibbles are unpacked for at once

// Block pair b, b + 1 (b alone without `Pair`) of `Rows` outputs × `Xs` rows of x from `row`.
template <int64_t Rows, int64_t Xs, bool Pair>
inline void pair_step(const ActivationBlocks& a, int64_t row, const uint8_t* w, int64_t row_bytes,
                      int64_t b, __m512 (*acc)[Rows]) {
  const __mmask64 bytes = Pair ? ~__mmask64{0} : __mmask64{0xFFFFFFFF};
  __m512i xq[Xs];
  __m512 x_scale[Xs];
  for (int64_t x = 0; x < Xs; ++x) {
    const float* sx = a.row_scales(row + x);
    xq[x] = _mm512_maskz_loadu_epi8(bytes, a.row_q(row + x) + b * kBlock);
    x_scale[x] = _mm512_insertf32x8(_mm512_set1_ps(sx[b]), _mm256_set1_ps(Pair ? sx[b + 1] : 0.f),
                                    1);
  }
  for (int64_t r = 0; r < Rows; ++r) {
    const uint8_t* block = w + r * row_bytes + b * kBlockBytes;
    _mm_prefetch(reinterpret_cast<const char*>(block + kAhead * row_bytes), _MM_HINT_T0);
    const __m512i nibbles = nibble_pair<Pair>(block);
    const float d1 = Pair ? read_float(block + kBlockBytes) : 0.f;
    const __m512 w_scale =
        _mm512_insertf32x8(_mm512_set1_ps(read_float(block)), _mm256_set1_ps(d1), 1);
    for (int64_t x = 0; x < Xs; ++x) {
      const __m512i dots = block_pair(nibbles, xq[x]);
      const __m512 scale = _mm512_mul_ps(w_scale, x_scale[x]);
      acc[x][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dots), scale, acc[x][r]);
    }
  }
}

// `Rows` outputs × `Xs` rows of x from `row`: out[x][r]. Each block pair's nibbles and scales
// are unpacked once for the `Xs` rows.
template <int64_t Rows, int64_t Xs>
void dot_tile(const ActivationBlocks& a, int64_t row, const uint8_t* w, int64_t k,
              float (*out)[kTile]) {
  const int64_t blocks = k / kBlock, row_bytes = blocks * kBlockBytes;
  __m512 acc[Xs][Rows];
  for (int64_t x = 0; x < Xs; ++x) {
    for (int64_t r = 0; r < Rows; ++r) acc[x][r] = _mm512_setzero_ps();
  }
  int64_t b = 0;
  for (; b + 1 < blocks; b += 2) pair_step<Rows, Xs, true>(a, row, w, row_bytes, b, acc);
  if (b < blocks) pair_step<Rows, Xs, false>(a, row, w, row_bytes, b, acc);
  for (int64_t x = 0; x < Xs; ++x) {
    for (int64_t r = 0; r < Rows; ++r) {
      const float minimum =
          minimum_term(w + r * row_bytes + 4, kBlockBytes, a.row_sums(row + x), blocks);
      out[x][r] = _mm512_reduce_add_ps(acc[x][r]) + minimum;
    }
  }
}
#elif defined(__AVX2__)
constexpr int64_t kGroup = 2;  // rows of x a tile's nibbles are unpacked for at once

template <int64_t Rows, int64_t Xs>
void dot_tile(const ActivationBlocks& a, int64_t row, const uint8_t* w, int64_t k,
              float (*out)[kTile]) {
  const int64_t blocks = k / kBlock, row_bytes = blocks * kBlockBytes;
  __m256 acc[Xs][Rows];
  for (int64_t x = 0; x < Xs; ++x) {
    for (int64_t r = 0; r < Rows; ++r) acc[x][r] = _mm256_setzero_ps();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  const __m128i low = _mm_set1_epi8(0x0F);
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i xq[Xs];
    __m256 x_scale[Xs];
    for (int64_t x = 0; x < Xs; ++x) {
      xq[x] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.row_q(row + x) + b * kBlock));
      x_scale[x] = _mm256_set1_ps(a.row_scales(row + x)[b]);
    }
    for (int64_t r = 0; r < Rows; ++r) {
      const uint8_t* block = w + r * row_bytes + b * kBlockBytes;
      _mm_prefetch(reinterpret_cast<const char*>(block + kAhead * row_bytes), _MM_HINT_T0);
      const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kNibbles));
      const __m256i nibbles = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low),
                                               _mm_and_si128(packed, low));
      const __m256 w_scale = _mm256_set1_ps(read_float(block));
      for (int64_t x = 0; x < Xs; ++x) {
        const __m256i dots = _mm256_madd_epi16(_mm256_maddubs_epi16(nibbles, xq[x]), ones);
        const __m256 scale = _mm256_mul_ps(w_scale, x_scale[x]);
        acc[x][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dots), scale, acc[x][r]);
      }
    }
  }
  for (int64_t x = 0; x < Xs; ++x) {
    for (int64_t r = 0; r < Rows; ++r) {
      const float minimum =
          minimum_term(w + r * row_bytes + 4, kBlockBytes, a.row_sums(row + x), blocks);
      out[x][r] = sum_lanes(acc[x][r]) + minimum;
    }
  }
}
#else
constexpr int64_t kGroup = 1;

template <int64_t Rows, int64_t Xs>
void dot_tile(const ActivationBlocks& a, int64_t row, const uint8_t* w, int64_t k,
              float (*out)[kTile]) {
  const int64_t blocks = k / kBlock, row_bytes = blocks * kBlockBytes;
  const int8_t* qx = a.row_q(row);
  const float* sx = a.row_scales(row);
  for (int64_t r = 0; r < Rows; ++r) {
    float total = 0.f;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* block = w + r * row_bytes + b * kBlockBytes;
      int32_t sum = 0;
      for (int64_t i = 0; i < kBlock / 2; ++i) {
        const uint8_t pair = block[kNibbles + i];
        sum += int32_t{pair & 0x0F} * qx[b * kBlock + i];
        sum += int32_t{pair >> 4} * qx[b * kBlock + kBlock / 2 + i];
      }
      total += static_cast<float>(sum) * (read_float(block) * sx[b]);
    }
    out[0][r] = total + minimum_term(w + r * row_bytes + 4, kBlockBytes, a.row_sums(row), blocks);
  }
}
#endif


// Rows of x `row` .. `row + xs - 1` (xs <= kGroup) against the tile's `rows` outputs.
template <int64_t Xs>
void group_tile(const ActivationBlocks& a, int64_t row, const uint8_t* w, int64_t row_bytes,
                int64_t k, int64_t rows, float (*dots)[kTile]) {
  if (rows == kTile) {
    dot_tile<kTile, Xs>(a, row, w, k, dots);
    return;
  }
  float one[kGroup][kTile];
  for (int64_t r = 0; r < rows; ++r) {
    dot_tile<1, Xs>(a, row, w + r * row_bytes, k, one);
    for (int64_t x = 0; x < Xs; ++x) dots[x][r] = one[x][0];
  }
}

template <typename T>
torch::Tensor q4_1_linear_typed(const torch::Tensor& x, const torch::Tensor& weight) {
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  const ActivationBlocks blocks(x.data_ptr<T>(), m, k, true);
  auto y = torch::empty({m, n}, x.options());
  const uint8_t* w = weight.data_ptr<uint8_t>();
  const int64_t row_bytes = weight.size(1);
  over_tiles<kTile, kGroup>(m, n, y.data_ptr<T>(), [&](int64_t row, int64_t xs, int64_t first,
                                                       int64_t rows, float (*dots)[kTile]) {
    const uint8_t* tile = w + first * row_bytes;
    switch (xs) {
      case 1: return group_tile<1>(blocks, row, tile, row_bytes, k, rows, dots);
#if defined(__AVX2__)
      case 2: return group_tile<2>(blocks, row, tile, row_bytes, k, rows, dots);
#endif
#if defined(__AVX512BW__)
      case 3: return group_tile<3>(blocks, row, tile, row_bytes, k, rows, dots);
      case 4: return group_tile<4>(blocks, row, tile, row_bytes, k, rows, dots);
#endif
    }
  });
  return y;
}

// handle -> the [out, blocks · 24] bytes, for the compiled step's op.
MatrixRegistry<torch::Tensor>& matrices() {
  static MatrixRegistry<torch::Tensor> held("q4_1_linear");
  return held;
}

torch::Tensor q4_1_linear_by_handle(const torch::Tensor& x, int64_t handle,
                                    int64_t out_features) {
  const torch::Tensor weight = matrices().get(handle);
  TORCH_CHECK(weight.size(0) == out_features, "q4_1_linear: matrix ", handle, " has ",
              weight.size(0), " rows, not ", out_features);
  return q4_1_linear(x.contiguous(), weight);
}

}  // namespace

void q4_1_register(int64_t handle, const torch::Tensor& weight) {
  matrices().put(handle, weight);
}

void q4_1_release(int64_t handle) { matrices().erase(handle); }

torch::Tensor q4_1_linear(const torch::Tensor& x, const torch::Tensor& weight) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "q4_1_linear: x must be a contiguous [rows, in]");
  TORCH_CHECK(x.size(1) % kBlock == 0, "q4_1_linear: in_features must be a multiple of 32");
  TORCH_CHECK(weight.scalar_type() == torch::kByte && weight.is_contiguous() &&
                  weight.dim() == 2 && weight.size(1) == x.size(1) / kBlock * kBlockBytes,
              "q4_1_linear: weight must be contiguous uint8 [out, in / 32 * 24]");
  if (x.scalar_type() == torch::kFloat) return q4_1_linear_typed<float>(x, weight);
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "q4_1_linear: x must be float32 or bfloat16");
  return q4_1_linear_typed<at::BFloat16>(x, weight);
}

}  // namespace tandem

TORCH_LIBRARY_FRAGMENT(tandem, m) {
  m.def("q4_1_linear(Tensor x, int handle, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(tandem, CPU, m) { m.impl("q4_1_linear", &tandem::q4_1_linear_by_handle); }
