// Rotary embedding in place on query [T, H * D] / key [T, Hkv * D] (rows may be
// strided views of a fused qkv tensor; the heads of a row are contiguous).
// cos_sin_cache [max_position, rot_dim]: cos in the first rot_dim / 2
// columns, sin in the rest. neox style rotates halves (x[:r/2], x[r/2:r]),
// GPT-J style interleaved pairs. Math in fp32.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <cstring>

#include "cpu_types.h"

namespace vllm_cpu {
namespace {

// Rotate one head from x into y (y may alias x); channels past rot_dim are
// copied when y is a different buffer.
template <typename T>
void rotate_neox(const T* x, T* y, const T* cos, const T* sin, int64_t half) {
  int64_t i = 0;
#ifdef VLLM_CPU_SIMD
  using namespace simd;
  for (; i + kLanes <= half; i += kLanes) {
    fvec x1 = load(x + i), x2 = load(x + half + i);
    fvec c = load(cos + i), s = load(sin + i);
    store(y + i, fmsub(x1, c, mul(x2, s)));
    store(y + half + i, fmadd(x2, c, mul(x1, s)));
  }
#endif
  for (; i < half; ++i) {
    const float x1 = to_float(x[i]), x2 = to_float(x[half + i]);
    const float c = to_float(cos[i]), s = to_float(sin[i]);
    y[i] = from_float<T>(x1 * c - x2 * s);
    y[half + i] = from_float<T>(x2 * c + x1 * s);
  }
}

// Interleaved pairs (x[2i], x[2i + 1]) rotated by (cos[i], sin[i]). Vector
// path: kLanes pairs per step, as two vectors of x; with c = cos[i] and
// s = sin[i] duplicated into both lanes of pair i, y = x * c -/+ swap(x) * s
// (even lanes subtract, odd lanes add: fmaddsub).
template <typename T>
void rotate_gptj(const T* x, T* y, const T* cos, const T* sin, int64_t half) {
  int64_t i = 0;
#ifdef VLLM_CPU_SIMD
  using namespace simd;
  for (; i + kLanes <= half; i += kLanes) {
    const fvec c = load(cos + i), s = load(sin + i);
    const fvec x0 = load(x + 2 * i), x1 = load(x + 2 * i + kLanes);
    store(y + 2 * i, fmaddsub(x0, dup_lo(c), mul(swap_pairs(x0), dup_lo(s))));
    store(y + 2 * i + kLanes, fmaddsub(x1, dup_hi(c), mul(swap_pairs(x1), dup_hi(s))));
  }
#endif
  for (; i < half; ++i) {
    const float x1 = to_float(x[2 * i]), x2 = to_float(x[2 * i + 1]);
    const float c = to_float(cos[i]), s = to_float(sin[i]);
    y[2 * i] = from_float<T>(x1 * c - x2 * s);
    y[2 * i + 1] = from_float<T>(x2 * c + x1 * s);
  }
}

struct RopeRows {
  const void* src;
  int64_t src_stride;
  void* dst;
  int64_t dst_stride;
  int64_t heads;
};

template <typename T>
void rope_all(const int64_t* pos, const RopeRows& q, const RopeRows& k, const T* cache,
              int64_t rot_dim, int64_t head_size, int64_t tokens, bool neox) {
  const int64_t half = rot_dim / 2;
  at::parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const T* cos = cache + pos[t] * rot_dim;
      const T* sin = cos + half;
      for (const RopeRows* r : {&q, &k}) {
        for (int64_t h = 0; h < r->heads; ++h) {
          const T* x = static_cast<const T*>(r->src) + t * r->src_stride + h * head_size;
          T* y = static_cast<T*>(r->dst) + t * r->dst_stride + h * head_size;
          neox ? rotate_neox(x, y, cos, sin, half) : rotate_gptj(x, y, cos, sin, half);
          if (y != x && rot_dim < head_size)
            std::memcpy(y + rot_dim, x + rot_dim, sizeof(T) * (head_size - rot_dim));
        }
      }
    }
  });
}

void check_2d(const at::Tensor& t, int64_t tokens, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.size(0) == tokens && t.stride(1) == 1, name,
              " must be [num_tokens, heads * head_size] with a contiguous last dim");
}

void rope_dispatch(const at::Tensor& positions, const RopeRows& q, const RopeRows& k,
                   const at::Tensor& query, int64_t head_size,
                   const at::Tensor& cos_sin_cache, bool is_neox) {
  TORCH_CHECK(cos_sin_cache.is_contiguous() && cos_sin_cache.scalar_type() == query.scalar_type(),
              "cos_sin_cache must be contiguous and of the query dtype");
  const int64_t rot_dim = cos_sin_cache.size(1);
  TORCH_CHECK(rot_dim <= head_size && rot_dim % 2 == 0, "bad rotary dim");
  const auto pos = positions.reshape({-1}).to(at::kLong).contiguous();
  AT_DISPATCH_SWITCH(query.scalar_type(), "rotary_embedding",
      AT_DISPATCH_CASE(at::ScalarType::Float, [&] {
        rope_all<float>(pos.data_ptr<int64_t>(), q, k, cos_sin_cache.data_ptr<float>(), rot_dim,
                        head_size, positions.numel(), is_neox);
      })
      AT_DISPATCH_CASE(at::ScalarType::BFloat16, [&] {
        rope_all<bf16>(pos.data_ptr<int64_t>(), q, k, cos_sin_cache.data_ptr<bf16>(), rot_dim,
                       head_size, positions.numel(), is_neox);
      })
      AT_DISPATCH_CASE(at::ScalarType::Half, [&] {
        rope_all<fp16>(pos.data_ptr<int64_t>(), q, k, cos_sin_cache.data_ptr<fp16>(), rot_dim,
                       head_size, positions.numel(), is_neox);
      }));
}

}  // namespace

// In place on query / key (upstream's op).
void rotary_embedding(const at::Tensor& positions, at::Tensor& query,
                      std::optional<at::Tensor> key, int64_t head_size,
                      const at::Tensor& cos_sin_cache, bool is_neox) {
  const int64_t tokens = positions.numel();
  check_2d(query, tokens, "query");
  RopeRows q{query.data_ptr(), query.stride(0), query.data_ptr(), query.stride(0),
             query.size(1) / head_size};
  RopeRows k{nullptr, 0, nullptr, 0, 0};
  if (key.has_value()) {
    check_2d(*key, tokens, "key");
    k = RopeRows{key->data_ptr(), key->stride(0), key->data_ptr(), key->stride(0),
                 key->size(1) / head_size};
  }
  rope_dispatch(positions, q, k, query, head_size, cos_sin_cache, is_neox);
}

// Out of place: rotated copies in query_out / key_out, inputs untouched.
void rotary_embedding_out(const at::Tensor& positions, const at::Tensor& query,
                          const at::Tensor& key, int64_t head_size,
                          const at::Tensor& cos_sin_cache, bool is_neox,
                          at::Tensor& query_out, at::Tensor& key_out) {
  const int64_t tokens = positions.numel();
  check_2d(query, tokens, "query");
  check_2d(key, tokens, "key");
  check_2d(query_out, tokens, "query_out");
  check_2d(key_out, tokens, "key_out");
  TORCH_CHECK(query_out.sizes() == query.sizes() && key_out.sizes() == key.sizes(), "shape mismatch");
  RopeRows q{query.data_ptr(), query.stride(0), query_out.data_ptr(), query_out.stride(0),
             query.size(1) / head_size};
  RopeRows k{key.data_ptr(), key.stride(0), key_out.data_ptr(), key_out.stride(0),
             key.size(1) / head_size};
  rope_dispatch(positions, q, k, query, head_size, cos_sin_cache, is_neox);
}

}  // namespace vllm_cpu
