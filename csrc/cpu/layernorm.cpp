// RMS norm and fused residual-add + RMS norm over rows of [num_tokens, hidden].
// Statistics in fp32; one OpenMP task per chunk of rows.
#include <ATen/Parallel.h>
#include <torch/all.h>

#include "cpu_types.h"

namespace vllm_cpu {
namespace {

// Sum of squares of a row (fp32). When `res` is given, x + res is formed
// first (rounded to T, as the unfused path stores it), written to both x and
// res, and the statistics use that stored sum.
template <typename T>
float sum_squares(T* x, T* res, int64_t n) {
  int64_t i = 0;
  float total = 0.f;
#ifdef VLLM_CPU_AVX512
  __m512 acc = _mm512_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    __m512 v = load16(x + i);
    if (res != nullptr) {
      v = _mm512_add_ps(v, load16(res + i));
      store16(res + i, v);
      v = load16(res + i);  // the rounded sum
    }
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  total = _mm512_reduce_add_ps(acc);
#endif
  for (; i < n; ++i) {
    float v = to_float(x[i]);
    if (res != nullptr) {
      res[i] = from_float<T>(v + to_float(res[i]));
      v = to_float(res[i]);
    }
    total += v * v;
  }
  return total;
}

// out = src * inv_rms * weight.
template <typename T>
void scale_row(T* out, const T* src, const T* weight, float inv_rms, int64_t n) {
  int64_t i = 0;
#ifdef VLLM_CPU_AVX512
  __m512 s = _mm512_set1_ps(inv_rms);
  for (; i + 16 <= n; i += 16) {
    // Match torch: normalise in fp32, round to T, then multiply by the weight.
    __m512 v = _mm512_mul_ps(load16(src + i), s);
    if (!std::is_same<T, float>::value) {
      alignas(64) T tmp[16];
      store16(tmp, v);
      v = load16(tmp);
    }
    store16(out + i, _mm512_mul_ps(v, load16(weight + i)));
  }
#endif
  for (; i < n; ++i) {
    T normed = from_float<T>(to_float(src[i]) * inv_rms);
    out[i] = from_float<T>(to_float(normed) * to_float(weight[i]));
  }
}

template <typename T>
void rms_norm_rows(T* out, int64_t out_stride, T* in, int64_t in_stride, T* res,
                   int64_t res_stride, const T* weight, int64_t rows, int64_t n, double eps) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* x = in + r * in_stride;
      T* rr = res ? res + r * res_stride : nullptr;
      const float ss = sum_squares(x, rr, n);
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + static_cast<float>(eps));
      scale_row(out + r * out_stride, rr ? rr : x, weight, inv, n);
    }
  });
}

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, name, " must be a 2-D [tokens, hidden] tensor "
              "with a contiguous last dim");
}

}  // namespace

void rms_norm(torch::Tensor& out, const torch::Tensor& input, const torch::Tensor& weight,
              double epsilon) {
  check_rows(out, "out");
  check_rows(input, "input");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == input.size(1), "weight must be [hidden]");
  AT_DISPATCH_SWITCH(input.scalar_type(), "rms_norm",
      AT_DISPATCH_CASE(at::ScalarType::Float, [&] {
        rms_norm_rows<float>(out.data_ptr<float>(), out.stride(0), input.data_ptr<float>(),
                             input.stride(0), nullptr, 0, weight.data_ptr<float>(),
                             input.size(0), input.size(1), epsilon);
      })
      AT_DISPATCH_CASE(at::ScalarType::BFloat16, [&] {
        rms_norm_rows<bf16>(out.data_ptr<bf16>(), out.stride(0), input.data_ptr<bf16>(),
                            input.stride(0), nullptr, 0, weight.data_ptr<bf16>(),
                            input.size(0), input.size(1), epsilon);
      }));
}

// In place, as upstream: residual <- input + residual; input <- rms_norm(residual).
void fused_add_rms_norm(torch::Tensor& input, torch::Tensor& residual, const torch::Tensor& weight,
                        double epsilon) {
  check_rows(input, "input");
  check_rows(residual, "residual");
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == input.size(1), "weight must be [hidden]");
  AT_DISPATCH_SWITCH(input.scalar_type(), "fused_add_rms_norm",
      AT_DISPATCH_CASE(at::ScalarType::Float, [&] {
        rms_norm_rows<float>(input.data_ptr<float>(), input.stride(0), input.data_ptr<float>(),
                             input.stride(0), residual.data_ptr<float>(), residual.stride(0),
                             weight.data_ptr<float>(), input.size(0), input.size(1), epsilon);
      })
      AT_DISPATCH_CASE(at::ScalarType::BFloat16, [&] {
        rms_norm_rows<bf16>(input.data_ptr<bf16>(), input.stride(0), input.data_ptr<bf16>(),
                            input.stride(0), residual.data_ptr<bf16>(), residual.stride(0),
                            weight.data_ptr<bf16>(), input.size(0), input.size(1), epsilon);
      }));
}

}  // namespace vllm_cpu
