// Registers the CUDA ops of csrc/*.cu and csrc/attention/*.cu (the
// `vllm._C_cuda` library) under upstream's namespaces: torch.ops._C.<op> for
// layernorm / activation / rotary / attention, torch.ops._C_cache_ops.<op>
// for the KV-cache writes. Schemas are upstream's, except
// paged_attention_decode (this project's op; the schema of
// torch.ops._C_cpu.paged_attention_decode).
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(_C, m) {
  m.def("rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()");
  m.impl("rms_norm", c10::kCUDA, &rms_norm);
  m.def("fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()");
  m.impl("fused_add_rms_norm", c10::kCUDA, &fused_add_rms_norm);
  m.def("rotary_embedding(Tensor positions, Tensor! query, Tensor!? key, int head_size, "
        "Tensor cos_sin_cache, bool is_neox) -> ()");
  m.impl("rotary_embedding", c10::kCUDA, &rotary_embedding);
  m.def("silu_and_mul(Tensor! result, Tensor input) -> ()");
  m.impl("silu_and_mul", c10::kCUDA, &silu_and_mul);
  m.def("paged_attention_v1(Tensor! out, Tensor query, Tensor key_cache, Tensor value_cache, "
        "int num_kv_heads, float scale, Tensor block_tables, Tensor seq_lens, int block_size, "
        "int max_seq_len, Tensor? alibi_slopes, str kv_cache_dtype, Tensor k_scale, "
        "Tensor v_scale, int tp_rank, int blocksparse_local_blocks, "
        "int blocksparse_vert_stride, int blocksparse_block_size, "
        "int blocksparse_head_sliding_step) -> ()");
  m.impl("paged_attention_v1", c10::kCUDA, &paged_attention_v1);
  m.def("paged_attention_decode(Tensor! out, Tensor query, Tensor key_cache, Tensor value_cache, "
        "Tensor block_table, Tensor seq_lens, float scale, int sliding_window, float soft_cap) -> ()");
  m.impl("paged_attention_decode", c10::kCUDA, &paged_attention_decode);
}

TORCH_LIBRARY(_C_cache_ops, m) {
  m.def("reshape_and_cache(Tensor key, Tensor value, Tensor! key_cache, Tensor! value_cache, "
        "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()");
  m.impl("reshape_and_cache", c10::kCUDA, &reshape_and_cache);
  m.def("reshape_and_cache_flash(Tensor key, Tensor value, Tensor! key_cache, "
        "Tensor! value_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, "
        "Tensor v_scale) -> ()");
  m.impl("reshape_and_cache_flash", c10::kCUDA, &reshape_and_cache_flash);
}

// `import vllm._C_cuda` loads this library (running the registrations
// above); the Python module itself is empty.
#include <Python.h>
extern "C" PyObject* PyInit__C_cuda(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C_cuda",
                               "vllm compiled CUDA ops (torch.ops._C, torch.ops._C_cache_ops)",
                               -1, nullptr};
  return PyModule_Create(&module);
}
