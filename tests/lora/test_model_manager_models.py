"""LoRA support of the models that share Llama's layout (SupportsLoRA +
embedding_modules inherited from LlamaForCausalLM): Qwen2 (q/k/v bias) and
Qwen3 (per-head q/k norms) with one adapter and the base model in one step
equal transformers' merged peft model row by row, float32."""

from __future__ import annotations

import pytest
import torch

from tests.lora.manager_utils import (
    build_adapters,
    lora_model_and_worker,
    merged_peft_logits,
    request,
    run_step,
)
from tests.lora.peft_utils import make_peft_adapter
from tests.models.zoo_utils import build_zoo_model
from tests.utils import TINY_SHAPES, TINY_VOCAB, make_tiny_model, make_tiny_tokenizer
from vllm.model_executor.models.deepseek_v2 import DeepseekV2ForCausalLM
from vllm.model_executor.models.interfaces import supports_lora
from vllm.model_executor.models.mixtral import MixtralForCausalLM
from vllm.model_executor.models.phi3 import Phi3ForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_llama_layout_models_match_peft(kind, tmp_path):
    base = make_tiny_model(kind, str(tmp_path / kind))
    path = build_adapters(base, str(tmp_path / "adapters"), {"x": (8, 4)})["x"]
    model, worker, config = lora_model_and_worker(base, max_loras=1, max_cpu_loras=1)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (6, 9)]
    batch = [(prompts[0], request("x", 1, path)), (prompts[1], None)]
    for (tokens, req), ours in zip(batch, run_step(model, config, worker, batch)):
        ref = merged_peft_logits(base, None if req is None else path, tokens)
        torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)


def test_lora_support_flags():
    """Llama-layout models take LoRA; DeepSeek-V2 does not (MLA reads
    kv_b_proj's weight directly, so a LoRA around it would never run)."""
    for cls in (Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, MixtralForCausalLM):
        assert supports_lora(cls) and cls.embedding_modules == {
            "embed_tokens": "input_embeddings",
            "lm_head": "output_embeddings",
        }
    assert not supports_lora(DeepseekV2ForCausalLM)


def _tiny_phi3(out_dir: str) -> str:
    import transformers as tf

    config = tf.Phi3Config(
        **TINY_SHAPES,
        vocab_size=TINY_VOCAB,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    tf.Phi3ForCausalLM(config).eval().save_pretrained(out_dir)
    make_tiny_tokenizer(out_dir)
    return out_dir


def test_phi3_fused_modules_adapted_whole(tmp_path):
    """Phi-3's checkpoint fuses q/k/v and gate/up, so its peft adapters target
    qkv_proj and gate_up_proj: one A and one B over all the fused outputs."""
    base = _tiny_phi3(str(tmp_path / "phi3"))
    path = str(tmp_path / "adapter")
    targets = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    make_peft_adapter(base, path, r=8, lora_alpha=16, seed=6, target_modules=targets)
    model, worker, config = lora_model_and_worker(base, max_loras=1, max_cpu_loras=1)
    tokens = torch.randint(1, 512, (8,), generator=torch.Generator().manual_seed(2)).tolist()
    (ours,) = run_step(model, config, worker, [(tokens, request("x", 1, path))])
    torch.testing.assert_close(ours, merged_peft_logits(base, path, tokens), atol=2e-4, rtol=1e-4)
    lora = worker._adapter_manager.get_adapter(1)
    assert lora is not None and not lora.get_lora("model.layers.0.self_attn.qkv_proj").is_packed


def test_gemma2_projections_match_peft(tmp_path):
    """Gemma-2 (attention and final logit soft-caps, sliding window, tied head):
    its projections take LoRA (as upstream, no embedding_modules: an adapter of
    the embedding is refused by name)."""
    base = build_zoo_model("gemma2", str(tmp_path / "gemma2"))
    path = build_adapters(base, str(tmp_path / "adapters"), {"g": (8, 7)})["g"]
    model, worker, config = lora_model_and_worker(base, max_loras=1, max_cpu_loras=1)
    tokens = torch.randint(1, 512, (10,), generator=torch.Generator().manual_seed(3)).tolist()
    batch = [(tokens, request("g", 1, path)), (tokens[:7], None)]
    for (toks, req), ours in zip(batch, run_step(model, config, worker, batch)):
        ref = merged_peft_logits(base, None if req is None else path, toks)
        torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)
    emb = str(tmp_path / "emb")
    make_peft_adapter(base, emb, r=8, lora_alpha=16, target_modules=["embed_tokens", "o_proj"])
    with pytest.raises(ValueError, match=r"but received \[.*embed_tokens"):
        worker.add_adapter(request("e", 2, emb))


# MoE models: what takes LoRA besides the attention projections.
MOE_TARGETS = {
    "mixtral": ["gate"],
    "qwen2_moe": ["shared_expert_gate", "gate_proj", "up_proj", "down_proj"],
}


@pytest.mark.parametrize("kind", list(MOE_TARGETS))
def test_moe_attention_router_lora_experts_refused(kind, tmp_path):
    """Mixtral / Qwen2-MoE: the attention projections, Mixtral's router
    (`mlp.gate`; peft cannot target Qwen2-MoE's) and Qwen2-MoE's shared expert
    and its gate take LoRA; the FusedMoE experts are no LoRA target, so an
    adapter of the experts (peft's target_parameters on the fused expert
    weights) is refused naming them, loading nothing."""
    base = build_zoo_model(kind, str(tmp_path / kind))
    path = str(tmp_path / "attn")
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", *MOE_TARGETS[kind]]
    make_peft_adapter(base, path, r=8, lora_alpha=16, seed=8, target_modules=targets)
    model, worker, config = lora_model_and_worker(base, max_loras=1, max_cpu_loras=1)
    tokens = torch.randint(1, 512, (9,), generator=torch.Generator().manual_seed(4)).tolist()
    (ours,) = run_step(model, config, worker, [(tokens, request("m", 1, path))])
    torch.testing.assert_close(ours, merged_peft_logits(base, path, tokens), atol=2e-4, rtol=1e-4)
    assert "model.layers.0.mlp.gate" in worker._adapter_manager.modules  # router wrapped

    experts = str(tmp_path / "experts")
    make_peft_adapter(
        base,
        experts,
        r=8,
        lora_alpha=16,
        target_modules=["q_proj"],
        target_parameters=["mlp.experts.gate_up_proj"],
    )
    with pytest.raises(ValueError, match=r"but received \[.*mlp\.experts"):
        worker.add_adapter(request("e", 2, experts))
    assert worker.list_adapters() == {1}


def _hidden_states(model, config, worker, tokens: list[int], req) -> torch.Tensor:
    """The body's last hidden states ([T, hidden]) of one prompt under `req`."""
    from tests.model_executor.paged_harness import PagedHarness
    from vllm.forward_context import set_forward_context
    from vllm.lora.layers import LoRAMapping

    ids = [req.lora_int_id] * len(tokens)
    worker.set_active_adapters([req], LoRAMapping(ids, ids, is_prefill=True))
    harness = PagedHarness(model, config)
    cm = harness._common_metadata([("r", tokens)])
    md = harness.builder.build(common_prefix_len=0, common_attn_metadata=cm)
    with (
        torch.inference_mode(),
        set_forward_context({name: md for name in harness.layer_names}, config),
    ):
        return model(torch.tensor(tokens), torch.arange(len(tokens)))


def test_pooling_model_body_lora_matches_peft(tmp_path):
    """An embedding model (the Llama body, no LM head) takes LoRA on its body:
    an adapter of the causal LM (`model.layers...`) and one trained on the
    bare body (`layers...`, upstream's pooling-model prefix rule) both give
    the merged peft body's last hidden states, float32."""
    import transformers as tf
    from peft import LoraConfig, PeftModel, get_peft_model

    from vllm.config.lora import LoRAConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.lora.worker_manager import LRUCacheWorkerLoRAManager
    from vllm.model_executor.model_loader import get_model

    base = make_tiny_model("llama", str(tmp_path / "llama"))
    causal = build_adapters(base, str(tmp_path / "adapters"), {"c": (8, 9)})["c"]
    bare = str(tmp_path / "bare")
    torch.manual_seed(10)
    body = tf.AutoModel.from_pretrained(base, dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "down_proj"])
    lora.init_lora_weights = False
    get_peft_model(body, lora).save_pretrained(bare)

    config = EngineArgs(
        model=base, runner="pooling", dtype="float32", block_size=8, device="cpu"
    ).create_engine_config()
    config.lora_config = LoRAConfig(max_lora_rank=16, max_loras=1, lora_dtype=torch.float32)
    model = get_model(vllm_config=config)
    worker = LRUCacheWorkerLoRAManager(config, torch.device("cpu"), model.embedding_modules)
    model = worker.create_lora_manager(model, config)
    tokens = torch.randint(1, 512, (7,), generator=torch.Generator().manual_seed(5)).tolist()
    for lora_id, path in ((1, causal), (2, bare)):
        ours = _hidden_states(model, config, worker, tokens, request(f"p{lora_id}", lora_id, path))
        ref_body = tf.AutoModel.from_pretrained(base, dtype=torch.float32)
        if path == causal:
            # The causal-LM adapter's names carry `model.`: load it on the LM.
            lm = tf.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
            ref_body = PeftModel.from_pretrained(lm, path).merge_and_unload().model
        else:
            ref_body = PeftModel.from_pretrained(ref_body, path).merge_and_unload()
        with torch.no_grad():
            ref = ref_body(torch.tensor([tokens])).last_hidden_state[0]
        torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)
        with torch.no_grad():
            plain = tf.AutoModel.from_pretrained(base, dtype=torch.float32)
            assert (plain(torch.tensor([tokens])).last_hidden_state[0] - ref).abs().max() > 1e-2
    assert "model.layers.0.self_attn.qkv_proj" in worker._adapter_manager.get_adapter(2).loras
