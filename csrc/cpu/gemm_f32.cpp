// Dense fp32 GEMM over a panel-packed weight: out[M, N] = x[M, K] @ W.T (+ bias).
//
// Why: on CPUs with AVX2 but no AVX-512 (AMD EPYC Zen 2/3 among them) the
// engine runs fp32, and a batch-1 decode step is one pass over every weight.
// oneDNN's packed GEMV reads them at ~28 GB/s there, this loop at ~34 GB/s
// (391 MB of a 120M model's projections, 2 threads), and its register tile
// keeps pace with oneDNN at prefill sizes. vllm/model_executor/layers/utils.py
// packs fp32 weights this way only where the ops run their AVX2 build.
//
// Layout (`pack`, done once in Python): P[j][k][c] = W[16 j + c][k], shape
// [N / 16, K, 16]. A panel holds 16 output columns k-major, so one k step of
// a panel is 64 contiguous bytes (two ymm), and a thread's panels are one
// sequential stream: the hardware prefetcher's best case for decode.
//
// Schedule: threads split the panels. For each block of kMC x rows, each of
// the thread's panels and each kKC slice of K, register tiles of kMR x rows
// by 16 columns (kMR x 2 accumulators) walk the slice: the panel slice
// (kKC x 64 B = 16 KiB) stays in L1 and the x block (kMC x kKC x 4 B =
// 96 KiB) in L2 while every x row of the block reuses it.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VLLM_GEMM_AVX2 1
#endif

namespace vllm_cpu {
namespace panel_gemm {

constexpr int64_t kNB = 16;   // panel width: the packed layout's, two ymm
constexpr int kMR = 6;        // 6 x 2 accumulators + 2 weight + 1 x register = 15 of 16 ymm
constexpr int64_t kKC = 256;  // 256 k x 64 B = 16 KiB of panel: L1 (32 KiB on Zen 3)
constexpr int64_t kMC = 96;   // 96 rows x 256 k x 4 B = 96 KiB of x: L2 (512 KiB)

struct Gemm {
  const float* x;     // [M, K] contiguous
  const float* p;     // [N / 16, K, 16]
  const float* bias;  // [N] or nullptr
  float* out;         // [M, N] contiguous
  int64_t M, N, K;
};

#ifdef VLLM_GEMM_AVX2
// out rows m .. m + MR, columns 16 j .. 16 j + 16, over k0 .. k0 + kc. The
// first slice starts from the bias (or zero), later ones from the partial
// sums in out.
template <int MR>
inline void tile(const Gemm& g, int64_t m, int64_t j, int64_t k0, int64_t kc) {
  // Where the sums start: out's partial sums, else the bias row (the same
  // for every x row: stride 0), else zeros. One uniform load keeps acc in
  // registers (branches per row made GCC keep it in memory).
  alignas(32) static constexpr float kZeros[kNB] = {};
  float* c = g.out + m * g.N + j * kNB;
  const float* init = k0 > 0 ? c : (g.bias != nullptr ? g.bias + j * kNB : kZeros);
  const int64_t init_stride = k0 > 0 ? g.N : 0;
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    acc[r][0] = _mm256_loadu_ps(init + r * init_stride);
    acc[r][1] = _mm256_loadu_ps(init + r * init_stride + 8);
  }
  const float* w = g.p + (j * g.K + k0) * kNB;
  const float* x = g.x + m * g.K + k0;
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 w0 = _mm256_loadu_ps(w + k * kNB);
    const __m256 w1 = _mm256_loadu_ps(w + k * kNB + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 a = _mm256_broadcast_ss(x + r * g.K + k);
      acc[r][0] = _mm256_fmadd_ps(a, w0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(a, w1, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(c + r * g.N, acc[r][0]);
    _mm256_storeu_ps(c + r * g.N + 8, acc[r][1]);
  }
}

// One x row (decode): two chains of 2 FMAs would wait on the FMA latency
// (4 cycles), so even and odd k accumulate apart and meet at the end.
inline void row(const Gemm& g, int64_t m, int64_t j) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;
  const float* w = g.p + j * g.K * kNB;
  const float* x = g.x + m * g.K;
  int64_t k = 0;
  for (; k + 2 <= g.K; k += 2) {
    const __m256 x0 = _mm256_broadcast_ss(x + k), x1 = _mm256_broadcast_ss(x + k + 1);
    a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + k * kNB), a0);
    a1 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + k * kNB + 8), a1);
    b0 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w + k * kNB + 16), b0);
    b1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(w + k * kNB + 24), b1);
  }
  if (k < g.K) {
    const __m256 x0 = _mm256_broadcast_ss(x + k);
    a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + k * kNB), a0);
    a1 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(w + k * kNB + 8), a1);
  }
  a0 = _mm256_add_ps(a0, b0);
  a1 = _mm256_add_ps(a1, b1);
  if (g.bias != nullptr) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(g.bias + j * kNB));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(g.bias + j * kNB + 8));
  }
  float* c = g.out + m * g.N + j * kNB;
  _mm256_storeu_ps(c, a0);
  _mm256_storeu_ps(c + 8, a1);
}

inline void tile_rows(const Gemm& g, int64_t m, int rows, int64_t j, int64_t k0, int64_t kc) {
  switch (rows) {
    case 6: return tile<6>(g, m, j, k0, kc);
    case 5: return tile<5>(g, m, j, k0, kc);
    case 4: return tile<4>(g, m, j, k0, kc);
    case 3: return tile<3>(g, m, j, k0, kc);
    case 2: return tile<2>(g, m, j, k0, kc);
    default: return tile<1>(g, m, j, k0, kc);
  }
}

void panels(const Gemm& g, int64_t j_begin, int64_t j_end) {
  if (g.M == 1) {
    for (int64_t j = j_begin; j < j_end; ++j) row(g, 0, j);
    return;
  }
  for (int64_t m0 = 0; m0 < g.M; m0 += kMC) {
    const int64_t m1 = std::min(g.M, m0 + kMC);
    for (int64_t j = j_begin; j < j_end; ++j) {
      for (int64_t k0 = 0; k0 < g.K; k0 += kKC) {
        const int64_t kc = std::min(kKC, g.K - k0);
        for (int64_t m = m0; m < m1; m += kMR) {
          tile_rows(g, m, static_cast<int>(std::min<int64_t>(kMR, m1 - m)), j, k0, kc);
        }
      }
    }
  }
}
#else
// Scalar reference of the same layout (builds without AVX2 + FMA).
void panels(const Gemm& g, int64_t j_begin, int64_t j_end) {
  for (int64_t m = 0; m < g.M; ++m) {
    for (int64_t j = j_begin; j < j_end; ++j) {
      for (int64_t c = 0; c < kNB; ++c) {
        float acc = g.bias != nullptr ? g.bias[j * kNB + c] : 0.f;
        for (int64_t k = 0; k < g.K; ++k) acc += g.x[m * g.K + k] * g.p[(j * g.K + k) * kNB + c];
        g.out[m * g.N + j * kNB + c] = acc;
      }
    }
  }
}
#endif

}  // namespace panel_gemm

at::Tensor panel_gemm_f32(const at::Tensor& x, const at::Tensor& packed,
                          const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat,
              "panel_gemm_f32: x and the packed weight must be float32");
  constexpr int64_t kNB = panel_gemm::kNB;
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == kNB && packed.is_contiguous(),
              "panel_gemm_f32: the packed weight must be a contiguous [N / 16, K, 16] tensor");
  const int64_t K = packed.size(1), N = packed.size(0) * kNB;
  TORCH_CHECK(x.size(-1) == K, "panel_gemm_f32: x has ", x.size(-1), " features, the weight ", K);
  const at::Tensor x2 = x.reshape({-1, K}).contiguous();
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
  out_shape.back() = N;
  at::Tensor out = at::empty(out_shape, x.options());
  const float* b = nullptr;
  at::Tensor bias_c;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == N,
                "panel_gemm_f32: bias must be float32 with ", N, " elements");
    bias_c = bias->contiguous();
    b = bias_c.data_ptr<float>();
  }
  using namespace panel_gemm;
  const Gemm g{x2.data_ptr<float>(), packed.data_ptr<float>(), b, out.data_ptr<float>(),
               x2.size(0), N, K};
  if (g.M == 0) return out;
  // Grain: panels per task, so that a small layer (N = 768: 48 panels) still
  // splits across the threads while each task streams >= 4 panels.
  at::parallel_for(0, N / kNB, 4, [&](int64_t begin, int64_t end) { panels(g, begin, end); });
  return out;
}

}  // namespace vllm_cpu
