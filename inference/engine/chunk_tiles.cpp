// Causal attention of a prompt chunk on AMX tiles: the Xeon with AMX's matrix unit, for a
// bfloat16 cache with head_dim 32 or 64 (native_attention.py takes it there, the vector
// kernel of chunk_attention.cpp elsewhere).
//
// The vector kernel spends a chain of multiply-adds per (query, key) and per (weight, value):
// late in a long prompt a chunk is compute-bound, its time grows with its rows (8 rows over
// 2,000 keys of a 30-layer cache 9.4 ms, 64 rows 48 ms). Here a tile of 16 queries meets 16
// keys at a time in one tile multiply, the scores transposed, Sᵀ = K · Qᵀ: the cache's key
// rows loaded as they lie (no copy) against the queries paired by dimension once per chunk,
// so the scores land [key][lane] for a vectorised softmax per lane; then the weights,
// transposed to [lane][key] in bfloat16, times the values paired by key, into four tiles of
// 16 x 16 sums that stay in the unit over all the keys. Same cache, 2-core Xeon with AMX:
// 8 rows 3.81 ms, 64 rows 17.46 ms (docs/engine.md, "Prompt chunks on AMX tiles").
//
// A row's result depends on its own query, its keys and their order only, as in the vector
// kernel: a score is one tile element's sum over head_dim; the softmax runs over the keys in
// key order; the value sums run in blocks of 32 keys from key 0, and a key past the row's
// position (or past the chunk's last, zero-filled) weighs exactly 0. So a prompt comes out the
// same bits however it is cut into chunks. The weights are rounded to bfloat16 for the tile
// multiply (torch's flash attention does the same on AMX); the sums stay float32.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_kernels.h"

#if defined(CPU_CAPABILITY_AVX512)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#endif

namespace tandem {

#if defined(CPU_CAPABILITY_AVX512)
namespace {

using fVec = at::vec::Vectorized<float>;
using bf16 = at::BFloat16;

constexpr int64_t kLanes = 16;  // queries per tile, keys per score tile: a tile's rows
constexpr int64_t kKeys = 32;   // keys per value step: a bfloat16 tile row

// Palette 1, all eight tiles 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {64, 64, 64, 64, 64, 64, 64, 64};
  uint8_t rows[16] = {16, 16, 16, 16, 16, 16, 16, 16};
};

#define TILES __attribute__((target("amx-tile,amx-bf16,avx512bf16")))

// Two value rows interleaved element by element: one row of the value tiles' layout.
template <int64_t D>
TILES void pair_rows(const bf16* a, const bf16* b, bf16* dst) {
  const __m512i low = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                       40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                       32, 0);
  const __m512i high = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25,
                                        56, 24, 55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18,
                                        49, 17, 48, 16);
  for (int64_t d = 0; d < D; d += 32) {
    const __m512i x = _mm512_loadu_si512(a + d), y = _mm512_loadu_si512(b + d);
    _mm512_storeu_si512(dst + 2 * d, _mm512_permutex2var_epi16(x, low, y));
    _mm512_storeu_si512(dst + 2 * d + 32, _mm512_permutex2var_epi16(x, high, y));
  }
}

struct Chunk {
  const bf16 *q, *k, *v;
  bf16* out;
  int64_t heads, groups, queries, tiles, padded, start, ks0, ks1, vs0, vs1;
  float scale;
};

// Work items begin .. end, each a (KV head, tile of 16 queries); tiles configured per thread.
template <int64_t D>
TILES void tile_items(const Chunk& c, int64_t begin, int64_t end) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  TileConfig config;
  _tile_loadconfig(&config);
  alignas(64) bf16 qv[D * kLanes];      // the queries paired by dimension: Qᵀ's tiles
  alignas(64) bf16 tail[kLanes * D];    // key rows past the chunk's last key: zeros
  alignas(64) bf16 pt[kLanes * kKeys];  // weights [lane][key]
  alignas(64) bf16 vt[kKeys * D];       // values paired by key
  alignas(64) float acc[kLanes * D];
  alignas(64) float block[2][kLanes * kLanes];
  alignas(64) bf16 zero[D] = {};
  std::vector<float> w(c.padded * kLanes);  // scores, then weights, [key][lane]
  float totals[kLanes];
  for (int64_t item = begin; item < end; ++item) {
    const int64_t h = item / c.tiles, first = item % c.tiles * kLanes;
    const int64_t lanes = std::min(kLanes, c.queries - first);
    const int64_t last_row = (first + lanes - 1) / c.groups;
    const int64_t keys = c.start + last_row + 1;
    const int64_t reach = (keys + kKeys - 1) / kKeys * kKeys;
    const bf16* kh = c.k + h * c.ks0;
    const bf16* vh = c.v + h * c.vs0;
    auto offset = [&](int64_t index) {
      return ((index / c.groups * c.heads + h) * c.groups + index % c.groups) * D;
    };
    std::memset(qv, 0, sizeof(qv));
    for (int64_t lane = 0; lane < lanes; ++lane) {
      const bf16* src = c.q + offset(first + lane);
      for (int64_t d = 0; d < D; ++d) qv[d / 2 * 2 * kLanes + lane * 2 + d % 2] = src[d];
    }
    _tile_loadd(3, qv, 64);
    if constexpr (D == 64) _tile_loadd(4, qv + 16 * 2 * kLanes, 64);
    for (int64_t l0 = 0; l0 < reach; l0 += kLanes) {
      const bf16* rows = kh + l0 * c.ks1;
      int64_t stride = c.ks1 * 2;
      if (l0 + kLanes > keys) {  // the cache may end here: copy, and zero what follows
        for (int64_t r = 0; r < kLanes; ++r) {
          std::memcpy(tail + r * D, l0 + r < keys ? rows + r * c.ks1 : zero, D * 2);
        }
        rows = tail;
        stride = D * 2;
      }
      _tile_zero(0);
      _tile_loadd(1, rows, stride);
      _tile_dpbf16ps(0, 1, 3);
      if constexpr (D == 64) {
        _tile_loadd(2, rows + 32, stride);
        _tile_dpbf16ps(0, 2, 4);
      }
      _tile_stored(0, w.data() + l0 * kLanes, 64);
    }
    for (int64_t lane = 0; lane < kLanes; ++lane) {
      const int64_t row = lane < lanes ? (first + lane) / c.groups : last_row;
      for (int64_t l = c.start + row + 1; l < reach; ++l) w[l * kLanes + lane] = minus_inf;
    }
    fVec top(minus_inf), total(0.0f);
    for (int64_t l = 0; l < keys; ++l) top = at::vec::maximum(top, fVec::loadu(w.data() + l * kLanes));
    const fVec scale(c.scale);
    for (int64_t l = 0; l < reach; ++l) {
      const fVec weight = ((fVec::loadu(w.data() + l * kLanes) - top) * scale).exp_u20();
      weight.store(w.data() + l * kLanes);
      total = total + weight;
    }
    total.store(totals);
    _tile_zero(4);
    _tile_zero(5);
    if constexpr (D == 64) {
      _tile_zero(6);
      _tile_zero(7);
    }
    for (int64_t l0 = 0; l0 < reach; l0 += kKeys) {
      at::vec::transpose_mxn<float, 16, 16>(w.data() + l0 * kLanes, kLanes, block[0], kLanes);
      at::vec::transpose_mxn<float, 16, 16>(w.data() + (l0 + 16) * kLanes, kLanes, block[1],
                                            kLanes);
      for (int64_t lane = 0; lane < kLanes; ++lane) {
        const __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(block[1] + lane * kLanes),
                                                  _mm512_loadu_ps(block[0] + lane * kLanes));
        _mm512_storeu_si512(pt + lane * kKeys, reinterpret_cast<__m512i>(pair));
      }
      for (int64_t r = 0; r < kKeys / 2; ++r) {
        const int64_t l = l0 + 2 * r;
        pair_rows<D>(l < keys ? vh + l * c.vs1 : zero, l + 1 < keys ? vh + (l + 1) * c.vs1 : zero,
                     vt + r * 2 * D);
      }
      _tile_loadd(0, pt, 64);
      _tile_loadd(1, vt, D * 4);
      _tile_dpbf16ps(4, 0, 1);
      _tile_loadd(2, vt + 32, D * 4);
      _tile_dpbf16ps(5, 0, 2);
      if constexpr (D == 64) {
        _tile_loadd(1, vt + 64, D * 4);
        _tile_dpbf16ps(6, 0, 1);
        _tile_loadd(2, vt + 96, D * 4);
        _tile_dpbf16ps(7, 0, 2);
      }
    }
    _tile_stored(4, acc, D * 4);
    _tile_stored(5, acc + 16, D * 4);
    if constexpr (D == 64) {
      _tile_stored(6, acc + 32, D * 4);
      _tile_stored(7, acc + 48, D * 4);
    }
    for (int64_t lane = 0; lane < lanes; ++lane) {
      bf16* dst = c.out + offset(first + lane);
      const fVec inverse(1.0f / totals[lane]);
      for (int64_t d = 0; d < D; d += 32) {
        const fVec a = fVec::loadu(acc + lane * D + d) * inverse;
        const fVec b = fVec::loadu(acc + lane * D + d + 16) * inverse;
        at::vec::convert_from_float<bf16>(a, b).store(dst + d);
      }
    }
  }
  _tile_release();
}

template <int64_t D>
void chunk(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
           int64_t start, float scale, torch::Tensor& out) {
  const int64_t n = q.size(0), heads = q.size(1), groups = q.size(2);
  const int64_t queries = n * groups, tiles = (queries + kLanes - 1) / kLanes;
  const Chunk c{q.const_data_ptr<bf16>(), k.const_data_ptr<bf16>(), v.const_data_ptr<bf16>(),
                out.mutable_data_ptr<bf16>(), heads, groups, queries, tiles,
                (start + n + kKeys - 1) / kKeys * kKeys, start, k.stride(0), k.stride(1),
                v.stride(0), v.stride(1), scale};
  at::parallel_for(0, heads * tiles, 1,
                   [&](int64_t begin, int64_t end) { tile_items<D>(c, begin, end); });
}

// AMX-BF16 and AMX-TILE in CPUID, and the kernel's leave to use the tiles' state
// (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA: Linux asks each process to request it).
bool request_tiles() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!(d >> 22 & 1) || !(d >> 24 & 1)) return false;
  constexpr int kRequestPermission = 0x1023, kTileData = 18;
  return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
}

}  // namespace

bool tiles_ready() {
  static const bool ready = request_tiles();
  return ready;
}

torch::Tensor chunk_attention_tiles(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, int64_t start, double scale) {
  TORCH_CHECK(tiles_ready(), "no AMX tiles on this CPU");
  check_chunk(q, k, v, start);
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16, "bfloat16");
  auto out = torch::empty_like(q);
  if (q.size(3) == 64) {
    chunk<64>(q, k, v, start, static_cast<float>(scale), out);
  } else {
    TORCH_CHECK(q.size(3) == 32, "head_dim 32 or 64");
    chunk<32>(q, k, v, start, static_cast<float>(scale), out);
  }
  return out;
}

#else

bool tiles_ready() { return false; }

torch::Tensor chunk_attention_tiles(const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, int64_t start, double scale) {
  TORCH_CHECK(false, "built without AVX-512: no AMX tiles");
}

#endif

}  // namespace tandem
