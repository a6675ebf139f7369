// reshape_and_cache: write the step's K/V rows into the paged cache by slot.
// key/value [T, Hkv, D] (rows may be strided), caches [NB, BS, Hkv, D] with
// contiguous (Hkv, D) per token; slot = block * BS + offset, slot < 0 = skip.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>

#include <cstring>

namespace vllm_cpu {

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value,
                       at::Tensor& key_cache, at::Tensor& value_cache,
                       const at::Tensor& slot_mapping) {
  const int64_t tokens = slot_mapping.numel();
  TORCH_CHECK(key.dim() == 3 && value.dim() == 3 && key.size(0) >= tokens, "key/value must be [T, Hkv, D]");
  TORCH_CHECK(key.stride(2) == 1 && key.stride(1) == key.size(2) && value.stride(2) == 1 &&
                  value.stride(1) == value.size(2), "a token's heads must be contiguous");
  TORCH_CHECK(key_cache.dim() == 4 && key_cache.stride(3) == 1 && key_cache.stride(2) == key_cache.size(3) &&
                  key_cache.stride(1) == key_cache.size(2) * key_cache.size(3),
              "key_cache must be [NB, BS, Hkv, D] with contiguous blocks");
  TORCH_CHECK(value_cache.strides() == key_cache.strides() && value_cache.sizes() == key_cache.sizes(),
              "key and value caches must match");
  TORCH_CHECK(key.scalar_type() == key_cache.scalar_type() && value.scalar_type() == key.scalar_type(),
              "dtype mismatch");
  const auto slots = slot_mapping.reshape({-1}).to(at::kLong).contiguous();
  const int64_t* s = slots.data_ptr<int64_t>();
  const int64_t row_bytes = key.size(1) * key.size(2) * key.element_size();
  const int64_t bs = key_cache.size(1), esz = key.element_size();
  auto* kc = static_cast<char*>(key_cache.data_ptr());
  auto* vc = static_cast<char*>(value_cache.data_ptr());
  const auto* k = static_cast<const char*>(key.data_ptr());
  const auto* v = static_cast<const char*>(value.data_ptr());
  const int64_t kcs0 = key_cache.stride(0) * esz, kcs1 = key_cache.stride(1) * esz;
  at::parallel_for(0, tokens, 256, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (s[t] < 0) continue;
      const int64_t off = (s[t] / bs) * kcs0 + (s[t] % bs) * kcs1;
      std::memcpy(kc + off, k + t * key.stride(0) * esz, row_bytes);
      std::memcpy(vc + off, v + t * value.stride(0) * esz, row_bytes);
    }
  });
}

}  // namespace vllm_cpu
