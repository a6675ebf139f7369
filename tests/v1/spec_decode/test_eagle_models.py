"""EAGLE-1 / EAGLE-3 heads and the target's auxiliary hidden states, over the
paged KV cache, against an independent reference built from transformers'
Llama modules and the checkpoint tensors (float32, prefill then decode)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from torch.nn import functional as F
from transformers import AutoModelForCausalLM

from tests.model_executor.paged_harness import PagedHarness
from tests.utils import make_tiny_model
from tests.v1.spec_decode.eagle_utils import RefHead, make_tiny_eagle, make_tiny_eagle3
from vllm.config import SpeculativeConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.forward_context import set_forward_context
from vllm.model_executor.model_loader import get_model
from vllm.model_executor.models.llama_eagle import share_target_embeddings, share_target_lm_head

AUX_IDS = [0, 1, 2]  # depths of the 2-layer target: embeddings, after layer 0, after layer 1


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    target = make_tiny_model("llama", str(tmp_path_factory.mktemp("target")))
    return {
        "target": target,
        "eagle": make_tiny_eagle(target, str(tmp_path_factory.mktemp("eagle"))),
        "eagle-own": make_tiny_eagle(
            target,
            str(tmp_path_factory.mktemp("eagle-own")),
            seed=2,
            with_embed_tokens=True,
            with_lm_head=True,
        ),
        "eagle3": make_tiny_eagle3(
            target,
            str(tmp_path_factory.mktemp("eagle3")),
            draft_vocab_size=200,
            aux_layer_ids=AUX_IDS,
        ),
    }


def _load(dirs, method: str, head: str):
    """(target, head, harness) sharing one VllmConfig (and its KV caches)."""
    config = EngineArgs(
        model=dirs["target"], dtype="float32", block_size=8, device="cpu"
    ).create_engine_config()
    spec = SpeculativeConfig(
        method=method,
        model=dirs[head],
        num_speculative_tokens=2,
        target_model_config=config.model_config,
        target_parallel_config=config.parallel_config,
    )
    config.speculative_config = spec  # the engine refuses eagle still; build directly
    target = get_model(vllm_config=config)
    draft = get_model(vllm_config=config, model_config=spec.draft_model_config)
    return target, draft, PagedHarness(target, config)


def _run(h: PagedHarness, model, req: str, ids: list[int], **kwargs):
    """One step of `model` for one request over the harness's paged cache."""
    cm = h._common_metadata([(req, ids)])
    md = h.builder.build(common_prefix_len=0, common_attn_metadata=cm)
    start = h.num_computed.get(req, 0)
    positions = torch.arange(start, start + len(ids))
    with torch.inference_mode(), set_forward_context({n: md for n in h.layer_names}, h.vllm_config):
        out = model(torch.tensor(ids), positions, **kwargs)
    h.num_computed[req] = start + len(ids)
    return out


def _close(a, b):
    torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("head", ["eagle", "eagle-own"])
def test_eagle_head_matches_reference(dirs, head):
    target, draft, h = _load(dirs, "eagle", head)
    own = head == "eagle-own"
    assert (draft.has_own_embed_tokens, draft.has_own_lm_head) == (own, own)
    assert share_target_embeddings(draft, target) is not own
    assert share_target_lm_head(draft, target) is not own
    ref = RefHead(dirs[head], eagle3=False)
    if not own:
        assert draft.model.embed_tokens is target.model.embed_tokens
        assert draft.lm_head is target.lm_head
    # The dense LM head is packed away on CPU after loading: read the files.
    weights = ref.w if own else load_file(f"{dirs['target']}/model.safetensors")
    embed_w = weights["embed_tokens.weight" if own else "model.embed_tokens.weight"]
    lm_w = weights["lm_head.weight"]
    ids = [5, 17, 3, 99, 42, 7, 250, 11, 64, 8]
    hidden = torch.randn(len(ids), 64, generator=torch.Generator().manual_seed(0))
    ref_logits, ref_carry = ref(ids, hidden, embed_w, lm_w)
    out, carry = _run(h, draft, "r", ids[:7], hidden_states=hidden[:7])  # prefill
    _close(carry, ref_carry[:7])
    _close(draft.compute_logits(out), ref_logits[:7])
    for i in range(7, len(ids)):  # decode: the paged cache holds the earlier keys
        out, carry = _run(h, draft, "r", ids[i : i + 1], hidden_states=hidden[i : i + 1])
        _close(carry, ref_carry[i : i + 1])
        _close(draft.compute_logits(out), ref_logits[i : i + 1])


def test_eagle3_head_and_target_aux_states_match_reference(dirs):
    target, draft, h = _load(dirs, "eagle3", "eagle3")
    assert (draft.has_own_embed_tokens, draft.has_own_lm_head) == (False, True)
    assert share_target_embeddings(draft, target) and not share_target_lm_head(draft, target)
    target.set_aux_hidden_state_layers(tuple(AUX_IDS))
    ids = [5, 17, 3, 99, 42, 7, 250, 11]
    final, aux = _run(h, target, "t", ids)
    hf_out = AutoModelForCausalLM.from_pretrained(dirs["target"], dtype=torch.float32)
    with torch.no_grad():
        states = hf_out(torch.tensor([ids]), output_hidden_states=True).hidden_states
    # HF: states[d] enters layer d; the last entry is after the final norm.
    assert len(aux) == 3
    for d, a in zip(AUX_IDS[:2], aux[:2]):
        _close(a, states[d][0])
    _close(final, states[-1][0])
    combined = draft.combine_hidden_states(torch.cat(aux, dim=-1))
    ref = RefHead(dirs["eagle3"], eagle3=True)
    _close(combined, F.linear(torch.cat(aux, -1), ref.w["fc.weight"]))
    embed_w = load_file(f"{dirs['target']}/model.safetensors")["model.embed_tokens.weight"]
    ref_logits, ref_carry = ref(ids, combined, embed_w, None)
    out, carry = _run(h, draft, "d", ids[:5], hidden_states=combined[:5])
    _close(carry, ref_carry[:5])
    logits = draft.compute_logits(out)
    _close(logits, ref_logits[:5])
    # Only the draft vocabulary's target ids can win.
    assert torch.isinf(logits).sum(1).eq(512 - 200).all()
    for i in range(5, len(ids)):
        out, carry = _run(h, draft, "d", ids[i : i + 1], hidden_states=combined[i : i + 1])
        _close(carry, ref_carry[i : i + 1])
        _close(draft.compute_logits(out), ref_logits[i : i + 1])


@pytest.mark.parametrize("kind", ["qwen2", "qwen3"])
def test_qwen_targets_output_aux_states(kind, tmp_path):
    """Qwen2/Qwen3 (Llama's body) hand out the residual stream at each depth."""
    target_dir = make_tiny_model(kind, str(tmp_path / kind))
    config = EngineArgs(
        model=target_dir, dtype="float32", block_size=8, device="cpu"
    ).create_engine_config()
    target = get_model(vllm_config=config)
    assert target.supports_eagle and target.supports_eagle3
    target.set_aux_hidden_state_layers((0, 1, 2))
    ids = [5, 17, 3, 99, 42, 7]
    final, aux = _run(PagedHarness(target, config), target, "t", ids)
    hf_model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    outs: list[torch.Tensor] = []
    hooks = [
        layer.register_forward_hook(lambda m, a, o: outs.append(o[0] if o.dim() == 3 else o))
        for layer in hf_model.model.layers
    ]
    with torch.no_grad():
        states = hf_model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    for h in hooks:
        h.remove()
    # Depth 0: embeddings; depth d: the output of layer d - 1 (pre-norm).
    for a, want in zip(aux, [states[0][0], *outs]):
        _close(a, want)
    _close(final, states[-1][0])
