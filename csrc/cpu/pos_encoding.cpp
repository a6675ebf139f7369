// Rotary embedding in place on query [T, H * D] / key [T, Hkv * D] (rows may be
// strided views of a fused qkv tensor; the heads of a row are contiguous).
// cos_sin_cache [max_position, rot_dim]: cos in the first rot_dim / 2
// columns, sin in the rest. neox style rotates halves (x[:r/2], x[r/2:r]),
// GPT-J style interleaved pairs. Math in fp32.
#include <ATen/Parallel.h>
#include <torch/all.h>

#include "cpu_types.h"

namespace vllm_cpu {
namespace {

template <typename T>
void rotate_neox(T* x, const T* cos, const T* sin, int64_t half) {
  int64_t i = 0;
#ifdef VLLM_CPU_AVX512
  for (; i + 16 <= half; i += 16) {
    __m512 x1 = load16(x + i), x2 = load16(x + half + i);
    __m512 c = load16(cos + i), s = load16(sin + i);
    store16(x + i, _mm512_fmsub_ps(x1, c, _mm512_mul_ps(x2, s)));
    store16(x + half + i, _mm512_fmadd_ps(x2, c, _mm512_mul_ps(x1, s)));
  }
#endif
  for (; i < half; ++i) {
    const float x1 = to_float(x[i]), x2 = to_float(x[half + i]);
    const float c = to_float(cos[i]), s = to_float(sin[i]);
    x[i] = from_float<T>(x1 * c - x2 * s);
    x[half + i] = from_float<T>(x2 * c + x1 * s);
  }
}

template <typename T>
void rotate_gptj(T* x, const T* cos, const T* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = to_float(x[2 * i]), x2 = to_float(x[2 * i + 1]);
    const float c = to_float(cos[i]), s = to_float(sin[i]);
    x[2 * i] = from_float<T>(x1 * c - x2 * s);
    x[2 * i + 1] = from_float<T>(x2 * c + x1 * s);
  }
}

template <typename T>
void rope_all(const int64_t* pos, T* q, int64_t q_stride, int64_t q_heads, T* k, int64_t k_stride,
              int64_t k_heads, const T* cache, int64_t rot_dim, int64_t head_size, int64_t tokens,
              bool neox) {
  const int64_t half = rot_dim / 2;
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* cos = cache + pos[t] * rot_dim;
      const T* sin = cos + half;
      for (int64_t h = 0; h < q_heads + k_heads; ++h) {
        T* x = h < q_heads ? q + t * q_stride + h * head_size
                           : k + t * k_stride + (h - q_heads) * head_size;
        neox ? rotate_neox(x, cos, sin, half) : rotate_gptj(x, cos, sin, half);
      }
    }
  });
}

}  // namespace

void rotary_embedding(const torch::Tensor& positions, torch::Tensor& query,
                      std::optional<torch::Tensor> key, int64_t head_size,
                      const torch::Tensor& cos_sin_cache, bool is_neox) {
  const int64_t tokens = positions.numel();
  TORCH_CHECK(query.dim() == 2 && query.size(0) == tokens && query.stride(1) == 1,
              "query must be [num_tokens, num_heads * head_size]");
  TORCH_CHECK(cos_sin_cache.is_contiguous() && cos_sin_cache.scalar_type() == query.scalar_type(),
              "cos_sin_cache must be contiguous and of the query dtype");
  const int64_t rot_dim = cos_sin_cache.size(1);
  TORCH_CHECK(rot_dim <= head_size && rot_dim % 2 == 0, "bad rotary dim");
  const auto pos = positions.reshape({-1}).to(torch::kInt64).contiguous();
  int64_t k_stride = 0, k_heads = 0;
  if (key.has_value()) {
    TORCH_CHECK(key->dim() == 2 && key->size(0) == tokens && key->stride(1) == 1,
                "key must be [num_tokens, num_kv_heads * head_size]");
    k_stride = key->stride(0);
    k_heads = key->size(1) / head_size;
  }
  AT_DISPATCH_SWITCH(query.scalar_type(), "rotary_embedding",
      AT_DISPATCH_CASE(at::ScalarType::Float, [&] {
        rope_all<float>(pos.data_ptr<int64_t>(), query.data_ptr<float>(), query.stride(0),
                        query.size(1) / head_size, key ? key->data_ptr<float>() : nullptr,
                        k_stride, k_heads, cos_sin_cache.data_ptr<float>(), rot_dim, head_size,
                        tokens, is_neox);
      })
      AT_DISPATCH_CASE(at::ScalarType::BFloat16, [&] {
        rope_all<bf16>(pos.data_ptr<int64_t>(), query.data_ptr<bf16>(), query.stride(0),
                       query.size(1) / head_size, key ? key->data_ptr<bf16>() : nullptr,
                       k_stride, k_heads, cos_sin_cache.data_ptr<bf16>(), rot_dim, head_size,
                       tokens, is_neox);
      }));
}

}  // namespace vllm_cpu
