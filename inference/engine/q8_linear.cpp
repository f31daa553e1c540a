// y = x Wᵀ with int8 weights and int8 activations, llama.cpp's scheme (Q8_0 activations):
// each row of x is rounded to int8 per block of 32 with a float scale, each weight row is int8
// with one float scale, and a block's products are summed in int32 (`vpdpbusd` on AVX-512
// VNNI, `vpmaddubsw` + `vpmaddwd` on AVX2 and AVX-512BW), then scaled and summed in float
// (inference/engine/weights/q8.py says why it exists and when the runner takes it).
//
// The weights are laid out for the read: each tile of kTile output rows holds its rows' first
// blocks, then their second blocks, and so on (row r's block b at b · kTile · 32 + r · 32 from
// the tile's start), so a task reads its weights as one ascending stream; the rows after the
// last full tile stay one after another (`weights/q8.py` `tile_rows` lays them out).
//
// A (row, output) sum runs in one order whatever the rows beside it, so a request's result is
// the same alone and in a batch, one row included.

#include <torch/extension.h>
#include <torch/library.h>

#include <immintrin.h>

#include <utility>

#include "activation_blocks.h"
#include "linear_kernels.h"
#include "matrix_registry.h"

namespace tandem {
namespace {

// Output rows a task computes together, also the weights' layout (`q8_tile()`): each
// activation block is loaded (and its signs taken) once for them.
constexpr int64_t kTile = 4;
// How far ahead of its reads a task asks for weight lines. The interleaved layout makes a
// task's reads one ascending stream; over a whole step's weights (cold, 2-core AMD EPYC Zen 2)
// one row took 6.8 ms at 1,024 bytes ahead, 7.1-7.5 at 512, 2,048 or 4,096, and 8.5 ms
// with rows laid out one after another.
constexpr int64_t kAheadBytes = 1024;

// A tile's weights: row r's block b at `w + b * block_stride + r * row_stride` (a full tile:
// strides kTile · 32 and 32; a lone row: 32 and unused).
struct TileWeights {
  const int8_t* w;
  int64_t block_stride, row_stride;

  const int8_t* at(int64_t r, int64_t b) const { return w + b * block_stride + r * row_stride; }
};

// Asks for the cache lines of `bytes` weights `kAheadBytes` past `from`.
inline void prefetch_ahead(const int8_t* from, int64_t bytes) {
  for (int64_t line = 0; line < bytes; line += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(from + kAheadBytes + line), _MM_HINT_T0);
  }
}

#if defined(__AVX512BW__)
// Two blocks (64 bytes) of x against two of w: 16 int32 lanes, the first 8 block b's.
inline __m512i block_pair(__m512i x_abs, __mmask64 x_negative, __m512i w) {
  const __m512i w_signed = _mm512_mask_sub_epi8(w, x_negative, _mm512_setzero_si512(), w);
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), x_abs, w_signed);
#else
  const __m512i pairs = _mm512_maddubs_epi16(x_abs, w_signed);
  return _mm512_madd_epi16(pairs, _mm512_set1_epi16(1));
#endif
}

template <int64_t Rows>
void dot_tile(const int8_t* qx, const float* sx, TileWeights w, int64_t k, float* out) {
  __m512 acc[Rows];
  for (int64_t r = 0; r < Rows; ++r) acc[r] = _mm512_setzero_ps();
  const int64_t blocks = k / kBlock;
  for (int64_t b = 0; b < blocks; b += 2) {
    const bool pair = b + 1 < blocks;
    const __mmask64 bytes = pair ? ~__mmask64{0} : __mmask64{0xFFFFFFFF};
    const __m512i x = _mm512_maskz_loadu_epi8(bytes, qx + b * kBlock);
    const __m512i x_abs = _mm512_abs_epi8(x);
    const __mmask64 x_negative = _mm512_movepi8_mask(x);
    const __m512 scale = _mm512_insertf32x8(_mm512_set1_ps(sx[b]),
                                            _mm256_set1_ps(pair ? sx[b + 1] : 0.f), 1);
    prefetch_ahead(w.at(0, b), 2 * w.block_stride);
    for (int64_t r = 0; r < Rows; ++r) {
      const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.at(r, b)));
      const __m256i high =
          pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.at(r, b + 1)))
               : _mm256_setzero_si256();
      const __m512i wv = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
      const __m512i sums = block_pair(x_abs, x_negative, wv);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), scale, acc[r]);
    }
  }
  for (int64_t r = 0; r < Rows; ++r) out[r] = _mm512_reduce_add_ps(acc[r]);
}
#elif defined(__AVX2__)
template <int64_t Rows>
void dot_tile(const int8_t* qx, const float* sx, TileWeights w, int64_t k, float* out) {
  __m256 acc[Rows];
  for (int64_t r = 0; r < Rows; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < k / kBlock; ++b) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qx + b * kBlock));
    const __m256i x_abs = _mm256_sign_epi8(x, x);
    const __m256 scale = _mm256_set1_ps(sx[b]);
    prefetch_ahead(w.at(0, b), w.block_stride);
    for (int64_t r = 0; r < Rows; ++r) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.at(r, b)));
      const __m256i pairs = _mm256_maddubs_epi16(x_abs, _mm256_sign_epi8(wv, x));
      const __m256i sums = _mm256_madd_epi16(pairs, ones);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), scale, acc[r]);
    }
  }
  for (int64_t r = 0; r < Rows; ++r) out[r] = sum_lanes(acc[r]);
}
#else
template <int64_t Rows>
void dot_tile(const int8_t* qx, const float* sx, TileWeights w, int64_t k, float* out) {
  for (int64_t r = 0; r < Rows; ++r) {
    float total = 0.f;
    for (int64_t b = 0; b < k / kBlock; ++b) {
      const int8_t* wb = w.at(r, b);
      int32_t sum = 0;
      for (int64_t i = 0; i < kBlock; ++i) sum += int32_t{qx[b * kBlock + i]} * int32_t{wb[i]};
      total += static_cast<float>(sum) * sx[b];
    }
    out[r] = total;
  }
}
#endif

template <typename T>
torch::Tensor q8_linear_typed(const torch::Tensor& x, const torch::Tensor& weight,
                              const torch::Tensor& scales) {
  const int64_t m = x.size(0), k = x.size(1), n = weight.size(0);
  const ActivationBlocks blocks(x.data_ptr<T>(), m, k, false);
  auto y = torch::empty({m, n}, x.options());
  const int8_t* w = weight.data_ptr<int8_t>();
  const float* ws = scales.data_ptr<float>();
  over_tiles<kTile, 1>(m, n, y.data_ptr<T>(), [&](int64_t row, int64_t, int64_t first,
                                                  int64_t rows, float (*group)[kTile]) {
    const int8_t* q = blocks.row_q(row);
    const float* s = blocks.row_scales(row);
    float* dots = group[0];
    if (rows == kTile) {
      dot_tile<kTile>(q, s, TileWeights{w + first * k, kTile * kBlock, kBlock}, k, dots);
    } else {
      for (int64_t r = 0; r < rows; ++r) {
        dot_tile<1>(q, s, TileWeights{w + (first + r) * k, kBlock, 0}, k, dots + r);
      }
    }
    for (int64_t r = 0; r < rows; ++r) dots[r] *= ws[first + r];
  });
  return y;
}

// handle -> (int8 weight, float32 scales), for the compiled step's op.
MatrixRegistry<std::pair<torch::Tensor, torch::Tensor>>& matrices() {
  static MatrixRegistry<std::pair<torch::Tensor, torch::Tensor>> held("q8_linear");
  return held;
}

torch::Tensor q8_linear_by_handle(const torch::Tensor& x, int64_t handle, int64_t out_features) {
  const auto [weight, scales] = matrices().get(handle);
  TORCH_CHECK(weight.size(0) == out_features, "q8_linear: matrix ", handle, " has ",
              weight.size(0), " rows, not ", out_features);
  return q8_linear(x.contiguous(), weight, scales);
}

}  // namespace

void q8_register(int64_t handle, const torch::Tensor& weight, const torch::Tensor& scales) {
  matrices().put(handle, {weight, scales});
}

void q8_release(int64_t handle) { matrices().erase(handle); }

torch::Tensor q8_linear(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& scales) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "q8_linear: x must be a contiguous [rows, in]");
  TORCH_CHECK(weight.scalar_type() == torch::kChar && weight.is_contiguous() &&
                  weight.dim() == 2 && weight.size(1) == x.size(1),
              "q8_linear: weight must be a contiguous int8 [out, in]");
  TORCH_CHECK(scales.scalar_type() == torch::kFloat && scales.numel() == weight.size(0),
              "q8_linear: scales must be float32 [out]");
  TORCH_CHECK(x.size(1) % kBlock == 0, "q8_linear: in_features must be a multiple of 32");
  if (x.scalar_type() == torch::kFloat) return q8_linear_typed<float>(x, weight, scales);
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16, "q8_linear: x must be float32 or bfloat16");
  return q8_linear_typed<at::BFloat16>(x, weight, scales);
}

int64_t q8_tile() { return kTile; }

const char* q8_instructions() {
#if defined(__AVX512VNNI__)
  return "avx512_vnni";
#elif defined(__AVX512BW__)
  return "avx512bw";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace tandem

TORCH_LIBRARY_FRAGMENT(tandem, m) {
  m.def("q8_linear(Tensor x, int handle, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(tandem, CPU, m) { m.impl("q8_linear", &tandem::q8_linear_by_handle); }
