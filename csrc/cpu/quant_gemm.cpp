// Weight-only quantized GEMM: out[M, N] = x[M, K] @ W.T with W kept low-bit,
//   W[n, k] = scales[n, k / g] * decode(w[n, k]) (+ offsets[n, k / g]).
// decode is the template parameter: int8 (sign-extend; GGUF Q8_0 / Q6_K /
// Q5_x after unpacking) or float8_e4m3fn (compressed-tensors / block FP8).
// fp32 accumulation; the per-group scale multiplies each group's dot product
// once (a vector FMA per group), offsets add offsets[n, g] * sum(x over g).
//
// Two schedules:
//  - small M (decode, memory-bound): each weight row is read from memory
//    once for all M rows: register tiles of NR weight rows x MT x rows
//    (MT <= kMaxMT) walk a block of rows that stays in L1 / L2.
//  - large M with bf16 / fp16 x (prefill, compute-bound): dequantize a block
//    of rows, round it to x's dtype and let torch's GEMM (at::mm) reuse it
//    across all M rows (see gemm_dequant_mm for the numerics).
// Vector paths: AVX-512 (VLLM_CPU_AVX512), AVX2 + FMA + F16C, else scalar;
// the build picks one from the compiler flags (CMakeLists.txt).
// Per-operator ATen headers instead of torch/all.h: the test compiles this
// file alone (twice) and the full header costs most of that time.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_types.h"

#if !defined(VLLM_CPU_AVX512) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define VLLM_QG_AVX2 1
#endif

namespace vllm_cpu {
namespace {

// e4m3fn byte: s eeee mmm (bias 7). Moving its 7 low bits up by 7 gives the
// fp16 pattern 0 0eeee mmm0000000 (bias 15), i.e. the same value times 2^-8,
// exactly: normals keep their mantissa, and e4m3 subnormals (eeee = 0,
// 2^-6 * 0.mmm) land on fp16 subnormals (2^-14 * 0.mmm), also x 2^-8, so no
// flush-to-zero can hit them in fp32. The 2^8 is folded into the group
// scale (kScale). The sign goes from bit 7 to bit 15. The two NaN bytes
// (0x7f, 0xff) decode as +-480 (checkpoints do not hold NaN weights).
inline uint16_t e4m3_to_half_bits(uint8_t b) {
  return static_cast<uint16_t>(((b & 0x80) << 8) | ((b & 0x7f) << 7));
}

// ------------------------------------------------------------ vector layer
#if defined(VLLM_CPU_AVX512)
constexpr const char* kIsa = "avx512";
constexpr int kMaxMT = 8;
constexpr int kTileElems = 8;  // NR x MT: 2 x 8 accumulators of 32 zmm
struct Vec {
  using V = __m512;
  static constexpr int W = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V set1(float a) { return _mm512_set1_ps(a); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(V a) { return _mm512_reduce_add_ps(a); }
  static V from_i8(const int8_t* p) {
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  }
  static V from_e4m3(const uint8_t* p) {
    // b << 7 puts the sign at bit 14; adding bit 14 to itself moves it to 15.
    __m256i v = _mm256_slli_epi16(
        _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 7);
    v = _mm256_add_epi16(v, _mm256_and_si256(v, _mm256_set1_epi16(0x4000)));
    return _mm512_cvtph_ps(v);
  }
};
#elif defined(VLLM_QG_AVX2)
constexpr const char* kIsa = "avx2";
constexpr int kMaxMT = 4;
constexpr int kTileElems = 4;  // 2 x 4 accumulators of 16 ymm
struct Vec {
  using V = __m256;
  static constexpr int W = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V set1(float a) { return _mm256_set1_ps(a); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(V a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
  static V from_i8(const int8_t* p) {
    __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  }
  static V from_e4m3(const uint8_t* p) {
    __m128i v = _mm_slli_epi16(
        _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))), 7);
    v = _mm_add_epi16(v, _mm_and_si128(v, _mm_set1_epi16(0x4000)));  // sign: bit 14 -> 15
    return _mm256_cvtph_ps(v);
  }
};
#else
constexpr const char* kIsa = "scalar";
constexpr int kMaxMT = 4;
constexpr int kTileElems = 4;
struct Vec {  // one lane: the same kernel as plain loops
  using V = float;
  static constexpr int W = 1;
  static V zero() { return 0.f; }
  static V set1(float a) { return a; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V v) { *p = v; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static float sum(V a) { return a; }
  static V from_i8(const int8_t* p) { return static_cast<float>(*p); }
  static V from_e4m3(const uint8_t* p) {
    return static_cast<float>(c10::Half(e4m3_to_half_bits(*p), c10::Half::from_bits()));
  }
};
#endif

// ------------------------------------------------------------- decoders
struct Int8Dec {
  using WT = int8_t;
  static constexpr float kScale = 1.f;
  static Vec::V load(const WT* p) { return Vec::from_i8(p); }
  static float scalar(WT b) { return static_cast<float>(b); }
};
struct E4m3Dec {
  using WT = uint8_t;
  static constexpr float kScale = 256.f;  // the 2^8 of e4m3_to_half_bits
  static Vec::V load(const WT* p) { return Vec::from_e4m3(p); }
  static float scalar(WT b) {
    return static_cast<float>(c10::Half(e4m3_to_half_bits(b), c10::Half::from_bits()));
  }
};

struct Problem {
  const void* x;         // [M, K] contiguous, the lane's XT (fp32 or bf16)
  const void* w;         // [N, K] weight bytes
  const float* scales;   // [N, G]
  const float* offsets;  // [N, G] or nullptr
  const float* xsum;     // [M, G] sums of x over each group (with offsets)
  int64_t M, N, K, g;
};

// How x meets the decoded weights: W elements per step into fp32 lanes.
// F32Lane: fp32 x, one FMA per element.
struct F32Lane {
  using XT = float;
  using XV = Vec::V;
  static constexpr int W = Vec::W;
  static XV load_x(const XT* p) { return Vec::load(p); }
  template <class Dec>
  static XV load_w(const typename Dec::WT* p) { return Dec::load(p); }
  static Vec::V dot(Vec::V acc, XV x, XV w) { return Vec::fma(x, w, acc); }
};

#if defined(VLLM_CPU_AVX512) && defined(__AVX512BF16__)
// Bf16Lane: bf16 x as given, weights decoded to bf16 (int8 and e4m3 values
// are exact in bf16), VDPBF16PS: 32 products per instruction, each exact in
// fp32 and summed in fp32 (twice the FMA rate; same numerics as F32Lane).
struct Bf16Lane {
  using XT = bf16;
  using XV = __m512bh;
  static constexpr int W = 32;
  static XV load_x(const XT* p) {
    return reinterpret_cast<XV>(_mm512_loadu_si512(reinterpret_cast<const void*>(p)));
  }
  template <class Dec>
  static XV load_w(const typename Dec::WT* p) {
    return _mm512_cvtne2ps_pbh(Dec::load(p + 16), Dec::load(p));  // (high, low) halves
  }
  static Vec::V dot(Vec::V acc, XV x, XV w) { return _mm512_dpbf16_ps(acc, x, w); }
};
#define VLLM_QG_BF16_LANE 1
#endif

// The kernel's compile-time choices: the weight decode, the group size
// (GS = 0: p.g at run time; else loops of known trip count, no tail),
// whether offsets are added, and the x lane.
template <class Dec_, int GS, bool Off, class Lane_ = F32Lane>
struct Cfg {
  using Dec = Dec_;
  using Lane = Lane_;
  static constexpr int kGroup = GS;
  static constexpr bool kOffsets = Off;
};

// out[m0 .. m0 + MT, n .. n + NR]: an NR (weight rows) x MT (x rows) register
// tile. Several weight rows give independent FMA chains when MT is small
// (decode: M = 1 would otherwise wait on one accumulator's latency). Each
// group's dot products gd are scaled once into acc.
template <class C, int MT, int NR>
void tile(const Problem& p, int64_t n, int64_t m0, float* out) {
  using V = Vec::V;
  using Dec = typename C::Dec;
  using L = typename C::Lane;
  const int64_t g = C::kGroup != 0 ? C::kGroup : p.g;
  const int64_t G = p.K / g;
  const int64_t full = g - g % L::W;  // vector part of a group
  const auto* w = static_cast<const typename Dec::WT*>(p.w) + n * p.K;
  const auto* x = static_cast<const typename L::XT*>(p.x) + m0 * p.K;
  V acc[NR][MT];
  float extra[NR][MT] = {};
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MT; ++m) acc[r][m] = Vec::zero();
  for (int64_t gi = 0; gi < G; ++gi) {
    const int64_t k0 = gi * g;
    V gd[NR][MT];
    for (int r = 0; r < NR; ++r)
      for (int m = 0; m < MT; ++m) gd[r][m] = Vec::zero();
    for (int64_t j = k0; j < k0 + full; j += L::W) {
      for (int r = 0; r < NR; ++r) {
        const auto wv = L::template load_w<Dec>(w + r * p.K + j);
        for (int m = 0; m < MT; ++m) gd[r][m] = L::dot(gd[r][m], L::load_x(x + m * p.K + j), wv);
      }
    }
    for (int r = 0; r < NR; ++r) {
      const float s = p.scales[(n + r) * G + gi] * Dec::kScale;
      const V sv = Vec::set1(s);
      for (int m = 0; m < MT; ++m) acc[r][m] = Vec::fma(sv, gd[r][m], acc[r][m]);
      if constexpr (C::kGroup == 0 || C::kGroup % L::W != 0) {
        for (int m = 0; m < MT; ++m) {  // a group that is not a multiple of the width
          float tail = 0.f;
          for (int64_t t = k0 + full; t < k0 + g; ++t)
            tail += static_cast<float>(x[m * p.K + t]) * Dec::scalar(w[r * p.K + t]);
          extra[r][m] += s * tail;
        }
      }
      if constexpr (C::kOffsets) {
        const float off = p.offsets[(n + r) * G + gi];
        for (int m = 0; m < MT; ++m) extra[r][m] += off * p.xsum[(m0 + m) * G + gi];
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int m = 0; m < MT; ++m) out[(m0 + m) * p.N + n + r] = Vec::sum(acc[r][m]) + extra[r][m];
}

// Rows [n0, n1) for x rows [m0, m0 + MT): NR-row tiles, single rows at the end.
template <class C, int MT>
void tile_rows(const Problem& p, int64_t n0, int64_t n1, int64_t m0, float* out) {
  constexpr int NR = kTileElems / MT > 1 ? kTileElems / MT : 1;
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) tile<C, MT, NR>(p, n, m0, out);
  for (; n < n1; ++n) tile<C, MT, 1>(p, n, m0, out);
}

// Register tiles (any M, decode's small M above all): threads split N. A
// block of kRowBlock weight rows is read from memory once and reused (from
// L1/L2) by every tile of x rows; M is cut into tiles of kMaxMT, then 4, 2, 1.
template <class C>
void gemm_tiles(const Problem& p, float* out) {
  constexpr int64_t kRowBlock = 16;
  const int64_t grain = std::max<int64_t>(kRowBlock, 65536 / std::max<int64_t>(p.K, 1));
  at::parallel_for(0, p.N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t nb = n0; nb < n1; nb += kRowBlock) {
      const int64_t ne = std::min(n1, nb + kRowBlock);
      int64_t m = 0;
      for (; m + kMaxMT <= p.M; m += kMaxMT) tile_rows<C, kMaxMT>(p, nb, ne, m, out);
      if constexpr (kMaxMT > 4) {
        if (m + 4 <= p.M) tile_rows<C, 4>(p, nb, ne, m, out), m += 4;
      }
      if (m + 2 <= p.M) tile_rows<C, 2>(p, nb, ne, m, out), m += 2;
      if (m < p.M) tile_rows<C, 1>(p, nb, ne, m, out);
    }
  });
}

// The group sizes of the formats in use get their own instantiations.
template <class Dec, bool Off, class Lane>
void gemm_tiles_dispatch(const Problem& p, float* out) {
  switch (p.g) {
    case 16: return gemm_tiles<Cfg<Dec, 16, Off, Lane>>(p, out);    // GGUF Q6_K
    case 32: return gemm_tiles<Cfg<Dec, 32, Off, Lane>>(p, out);    // GGUF Q8_0 / Q5_x
    case 128: return gemm_tiles<Cfg<Dec, 128, Off, Lane>>(p, out);  // block FP8, g128
    default: return gemm_tiles<Cfg<Dec, 0, Off, Lane>>(p, out);
  }
}

template <class Dec, class Lane>
void gemm_tiles_for(const Problem& p, float* out) {
  if (p.offsets != nullptr) return gemm_tiles_dispatch<Dec, true, Lane>(p, out);
  gemm_tiles_dispatch<Dec, false, Lane>(p, out);
}

// One weight row to fp32 (scales and offsets applied) into dst[K].
template <class Dec>
void dequant_row(const Problem& p, int64_t n, float* dst) {
  const auto* wr = static_cast<const typename Dec::WT*>(p.w) + n * p.K;
  const int64_t G = p.K / p.g;
  for (int64_t gi = 0; gi < G; ++gi) {
    const float s = p.scales[n * G + gi] * Dec::kScale;
    const float o = p.offsets != nullptr ? p.offsets[n * G + gi] : 0.f;
    const Vec::V sv = Vec::set1(s), ov = Vec::set1(o);
    int64_t j = gi * p.g;
    const int64_t end = j + p.g;
    for (; j + Vec::W <= end; j += Vec::W) Vec::store(dst + j, Vec::fma(Dec::load(wr + j), sv, ov));
    for (; j < end; ++j) dst[j] = Dec::scalar(wr[j]) * s + o;
  }
}

// Many rows of bf16 / fp16 x (prefill): torch's GEMM in x's dtype (oneDNN's
// bf16 dot products run ~5x the fp32 FMA rate here) on blocks of W
// dequantized to fp32 in parallel and rounded once to x's dtype, as
// upstream multiplies dequantized weights for large batches. The dense
// weight is never held whole: blocks of ~2^21 elements (4 MiB in bf16),
// large enough that the GEMM calls run at full speed.
// fp32 row -> T (bf16 / fp16, round to nearest even).
template <typename T>
void round_row(const float* src, T* dst, int64_t k) {
  int64_t i = 0;
#ifdef VLLM_CPU_AVX512
  for (; i + 16 <= k; i += 16) {
    if constexpr (std::is_same_v<T, bf16>) {
      store16(dst + i, load16(src + i));
    } else {
      const __m256i h = _mm512_cvtps_ph(load16(src + i), _MM_FROUND_TO_NEAREST_INT);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), h);
    }
  }
#endif
  for (; i < k; ++i) dst[i] = static_cast<T>(src[i]);
}

template <class Dec, typename T>
void gemm_dequant_mm(const Problem& p, const at::Tensor& x, at::Tensor& out) {
  const int64_t rows = std::clamp<int64_t>((int64_t{1} << 21) / p.K, 128, 2048);
  auto wx = at::empty({std::min(rows, p.N), p.K}, x.options());
  T* wb = static_cast<T*>(wx.data_ptr());
  for (int64_t b0 = 0; b0 < p.N; b0 += rows) {
    const int64_t nb = std::min(rows, p.N - b0);
    at::parallel_for(0, nb, 4, [&](int64_t r0, int64_t r1) {
      std::vector<float> row(p.K);  // L1-resident fp32 row
      for (int64_t r = r0; r < r1; ++r) {
        dequant_row<Dec>(p, b0 + r, row.data());
        round_row<T>(row.data(), wb + r * p.K, p.K);
      }
    });
    auto dst = out.narrow(1, b0, nb);  // a column block: BLAS writes it with ldc = N
    at::mm_out(dst, x, wx.narrow(0, 0, nb).t());
  }
}

// Above this many rows of bf16 / fp16 x, gemm_dequant_mm beats the register
// tiles (benchmarks/benchmark_quant_gemm.py). fp32 x always takes the tiles
// (exact fp32 dequantization; faster than fp32 sgemm on this machine).
constexpr int64_t kLargeM = 8;
#ifdef VLLM_QG_BF16_LANE
constexpr bool kHasBf16Lane = true;
#else
constexpr bool kHasBf16Lane = false;
#endif

template <class Dec>
at::Tensor quant_gemm(const at::Tensor& x, const at::Tensor& w,
                         const at::Tensor& scales, int64_t group_size,
                         const std::optional<at::Tensor>& offsets, const char* name) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), name,
              ": x [M, K] and w [N, K] expected, got ", x.sizes(), " and ", w.sizes());
  const int64_t M = x.size(0), N = w.size(0), K = w.size(1);
  TORCH_CHECK(group_size > 0 && K % group_size == 0, name, ": group_size ", group_size,
              " does not divide K = ", K);
  const int64_t G = K / group_size;
  TORCH_CHECK(w.is_contiguous() && scales.is_contiguous() && scales.scalar_type() == at::kFloat &&
                  scales.size(0) == N && scales.size(1) == G,
              name, ": contiguous w and float32 scales [N, K / group_size] expected");
  const float* off = nullptr;
  if (offsets.has_value()) {
    const auto& o = *offsets;
    TORCH_CHECK(o.is_contiguous() && o.scalar_type() == at::kFloat && o.size(0) == N &&
                    o.size(1) == G,
                name, ": offsets must be contiguous float32 [N, K / group_size]");
    off = o.data_ptr<float>();
  }
  if (M == 0 || N == 0) return at::zeros({M, N}, x.options());
  Problem p{nullptr, w.data_ptr(), scales.data_ptr<float>(), off, nullptr, M, N, K, group_size};
  if (M > kLargeM && x.scalar_type() != at::kFloat) {
    auto out = at::empty({M, N}, x.options());
    if (x.scalar_type() == at::kBFloat16) {
      gemm_dequant_mm<Dec, bf16>(p, x.contiguous(), out);
    } else {
      gemm_dequant_mm<Dec, c10::Half>(p, x.contiguous(), out);
    }
    return out;
  }
  // bf16 x: the bf16 dot-product lane where the build has it and groups
  // are whole steps of 32; else x in fp32.
  const bool bf16_lane = kHasBf16Lane && x.scalar_type() == at::kBFloat16 && group_size % 32 == 0;
  auto xl = bf16_lane ? x.contiguous() : x.to(at::kFloat).contiguous();
  p.x = xl.data_ptr();
  at::Tensor xsum;  // offsets[n, g] multiply the sum of x over group g
  if (off != nullptr) {
    xsum = xl.to(at::kFloat).view({M, G, group_size}).sum(-1).contiguous();
    p.xsum = xsum.data_ptr<float>();
  }
  auto out = at::empty({M, N}, x.options().dtype(at::kFloat));
#ifdef VLLM_QG_BF16_LANE
  if (bf16_lane) {
    gemm_tiles_for<Dec, Bf16Lane>(p, out.data_ptr<float>());
    return out.to(x.scalar_type());
  }
#endif
  gemm_tiles_for<Dec, F32Lane>(p, out.data_ptr<float>());
  return x.scalar_type() == at::kFloat ? out : out.to(x.scalar_type());
}

}  // namespace

at::Tensor int8_group_gemm(const at::Tensor& x, const at::Tensor& w,
                              const at::Tensor& scales, int64_t group_size,
                              const std::optional<at::Tensor>& offsets) {
  TORCH_CHECK(w.scalar_type() == at::kChar, "int8_group_gemm: w must be int8");
  return quant_gemm<Int8Dec>(x, w, scales, group_size, offsets, "int8_group_gemm");
}

at::Tensor fp8_weight_gemm(const at::Tensor& x, const at::Tensor& w,
                              const at::Tensor& scales, int64_t group_size) {
  TORCH_CHECK(w.scalar_type() == at::kFloat8_e4m3fn, "fp8_weight_gemm: w must be float8_e4m3fn");
  return quant_gemm<E4m3Dec>(x, w, scales, group_size, std::nullopt, "fp8_weight_gemm");
}

// Which vector path this build compiled ("avx512", "avx2" or "scalar").
std::string quant_gemm_isa() { return kIsa; }

}  // namespace vllm_cpu

#ifdef VLLM_QUANT_GEMM_STANDALONE
// tests/kernels/test_quant_gemm.py compiles this file alone with other ISA
// flags and registers the ops under a namespace of its own.
TORCH_LIBRARY(VLLM_QUANT_GEMM_STANDALONE, m) {
  m.def("int8_group_gemm(Tensor x, Tensor w, Tensor scales, int group_size, Tensor? offsets) "
        "-> Tensor");
  m.impl("int8_group_gemm", at::kCPU, &vllm_cpu::int8_group_gemm);
  m.def("fp8_weight_gemm(Tensor x, Tensor w, Tensor scales, int group_size) -> Tensor");
  m.impl("fp8_weight_gemm", at::kCPU, &vllm_cpu::fp8_weight_gemm);
  m.def("quant_gemm_isa() -> str", &vllm_cpu::quant_gemm_isa);
}
#endif
