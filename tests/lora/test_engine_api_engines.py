"""The LoRA engine API on real engines (issue 18 item 1): add_lora /
remove_lora / list_loras / pin_lora through LLMEngine (core in process and in
its own process) and AsyncLLM; a request's adapter is loaded before it is
queued, so a bad adapter raises the loader's typed error to the caller with
nothing loaded, and the engine keeps serving. The engine core runs in
process here; in its own process (SyncMPClient, AsyncLLM):
test_engine_api_mp.py. (Outputs equal to peft's merged model:
tests/lora/test_llama_parity.py.)"""

from __future__ import annotations

import os

import pytest
import torch

from tests.lora.peft_utils import make_peft_adapter
from vllm import LLM, SamplingParams
from vllm.exceptions import LoRAAdapterNotFoundError
from vllm.lora.request import LoRARequest

PROMPT = {"prompt_token_ids": [3, 14, 15, 92, 65]}
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
ENGINE_KWARGS = dict(dtype="float32", max_model_len=64, kv_cache_memory_bytes=8 * 2**20)


def make_adapters(base: str, root: str) -> dict[str, str]:
    """Two rank-8 peft adapters, a rank-16 one and a directory that is not an
    adapter, for the model at `base`: name -> path ("base": the model)."""
    paths = {"base": base}
    for name, seed, rank in (("a", 1, 8), ("b", 2, 8), ("rank16", 3, 16)):
        make_peft_adapter(base, os.path.join(root, name), r=rank, lora_alpha=16, seed=seed)
        paths[name] = os.path.join(root, name)
    paths["not_peft"] = os.path.join(root, "not-peft")
    os.makedirs(paths["not_peft"])
    with open(os.path.join(paths["not_peft"], "README"), "w") as f:
        f.write("no adapter_config.json here")
    return paths


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory) -> dict[str, str]:
    return make_adapters(tiny_model_dir("llama"), str(tmp_path_factory.mktemp("lora-adapters")))


def _lora(adapters: dict[str, str], name: str, lora_id: int) -> LoRARequest:
    return LoRARequest(name, lora_id, adapters[name])


def _tokens(llm: LLM, lora: LoRARequest | list[LoRARequest | None] | None = None) -> list[int]:
    (out,) = llm.generate([PROMPT], GREEDY, use_tqdm=False, lora_request=lora)
    return list(out.outputs[0].token_ids)


def _make_llm(adapters: dict[str, str], multiprocessing: bool) -> LLM:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if multiprocessing else "0")
        return LLM(
            adapters["base"], enable_lora=True, max_loras=2, max_lora_rank=8, **ENGINE_KWARGS
        )


@pytest.fixture(scope="module")
def llm(adapters):
    """The engine core in process (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    engine = _make_llm(adapters, multiprocessing=False)
    yield engine
    engine.llm_engine.shutdown()


@pytest.fixture(scope="module")
def reference(llm, adapters) -> dict[str, list[int]]:
    """Greedy tokens of the base model and of each adapter (the first run)."""
    ref = {"base": _tokens(llm)}
    for i, name in enumerate(("a", "b"), 1):
        ref[name] = _tokens(llm, _lora(adapters, name, i))
    return ref


def test_adapters_change_the_output_and_are_listed(llm, reference):
    assert reference["a"] != reference["base"] and reference["b"] != reference["base"]
    assert reference["a"] != reference["b"]
    assert llm.llm_engine.list_loras() == {1, 2}  # loaded by their first requests


def test_add_remove_pin_list(llm, adapters, reference):
    engine = llm.llm_engine
    a = _lora(adapters, "a", 1)
    assert engine.add_lora(a) is True  # already loaded by its request: True (upstream)
    assert engine.pin_lora(1) is True
    assert engine.remove_lora(2) is True
    assert engine.list_loras() == {1}
    # A removed adapter is loaded again by its next request; same tokens.
    assert _tokens(llm, _lora(adapters, "b", 2)) == reference["b"]
    assert engine.list_loras() == {1, 2}
    # A third adapter in the CPU cache (max_cpu_loras = max_loras = 2): the
    # pinned one stays (what else is evicted, and when, is the manager's
    # LRU: tests/lora/test_model_manager.py).
    assert engine.add_lora(_lora(adapters, "a", 3)) is True
    assert {1, 3} <= engine.list_loras()
    assert engine.remove_lora(3) is True
    # One call mixing both adapters and the base model (max_loras=2).
    outs = llm.generate(
        [PROMPT] * 3, GREEDY, use_tqdm=False, lora_request=[a, None, _lora(adapters, "b", 2)]
    )
    assert [list(o.outputs[0].token_ids) for o in outs] == [
        reference["a"],
        reference["base"],
        reference["b"],
    ]


@pytest.mark.parametrize(
    "name,error,match",
    [
        ("missing", LoRAAdapterNotFoundError, "No adapter found for"),
        ("not_peft", LoRAAdapterNotFoundError, "No adapter found for"),  # upstream: 404 too
        ("rank16", ValueError, "max_lora_rank"),
    ],
)
def test_bad_adapter_raises_and_the_engine_keeps_serving(
    llm, adapters, reference, name, error, match
):
    before = llm.llm_engine.list_loras()
    paths = {**adapters, "missing": os.path.join(adapters["not_peft"], "nothing-here")}
    bad = LoRARequest(name, 40, paths[name])
    with pytest.raises(error, match=match):
        llm.generate([PROMPT] * 2, GREEDY, use_tqdm=False, lora_request=[None, bad])
    with pytest.raises(error, match=match):
        llm.llm_engine.add_lora(bad)
    assert llm.llm_engine.list_loras() == before  # nothing loaded
    assert not llm.llm_engine.has_unfinished_requests()  # the good prompt was withdrawn
    assert _tokens(llm, _lora(adapters, "a", 1)) == reference["a"]
    assert _tokens(llm) == reference["base"]


def test_chat_and_beam_search_take_lora_requests(llm, adapters):
    from vllm.sampling_params import BeamSearchParams

    a, b = _lora(adapters, "a", 1), _lora(adapters, "b", 2)
    prompt = [{"role": "user", "content": "hi"}]
    kwargs = dict(
        use_tqdm=False, chat_template="{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    per_conversation = llm.chat([prompt, prompt], GREEDY, lora_request=[a, b], **kwargs)
    single = [llm.chat(prompt, GREEDY, lora_request=x, **kwargs)[0] for x in (a, b)]
    assert [o.outputs[0].token_ids for o in per_conversation] == [
        o.outputs[0].token_ids for o in single
    ]
    beams = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    with_lora = llm.beam_search([PROMPT, PROMPT], beams, lora_request=[a, None])
    assert with_lora[0].sequences[0].lora_request == a
    assert with_lora[1].sequences[0].lora_request is None
    with pytest.raises(ValueError, match="same length"):
        llm.beam_search([PROMPT], beams, lora_request=[a, b])


def test_core_refuses_a_bad_adapter_sent_past_the_front_end(llm, adapters, reference):
    """A request whose adapter the front end did not check (sent to the core
    directly) fails alone; the core never takes it into a step."""
    from vllm.v1.engine.core_client_base import InprocClient

    engine = llm.llm_engine
    bad = LoRARequest("gone", 41, os.path.join(adapters["not_peft"], "gone"))
    request = engine.input_processor.process_inputs("direct", PROMPT, GREEDY, lora_request=bad)
    engine.input_processor.assign_request_id(request)
    assert isinstance(engine.engine_core, InprocClient)
    with pytest.raises(LoRAAdapterNotFoundError):
        engine.engine_core.add_request(request)
    assert 41 not in engine.list_loras()
    assert _tokens(llm, _lora(adapters, "b", 2)) == reference["b"]


def test_lora_request_without_enable_lora(tiny_model_dir, adapters):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = LLM(tiny_model_dir("llama"), **ENGINE_KWARGS)
    try:
        with pytest.raises(ValueError, match="but LoRA is not enabled!"):
            _tokens(llm, _lora(adapters, "a", 1))
        with pytest.raises(RuntimeError, match="LoRA is not enabled"):
            llm.llm_engine.add_lora(_lora(adapters, "a", 1))
        assert len(_tokens(llm)) == GREEDY.max_tokens
    finally:
        llm.llm_engine.shutdown()


def _lora_weight_dtypes(model) -> set[tuple[str, object, object]]:
    from vllm.lora.layers import BaseLayerWithLoRA

    return {
        (type(m).__name__, m.lora_a_stacked[0].dtype, m.base_layer.weight.dtype)
        for m in model.modules()
        if isinstance(m, BaseLayerWithLoRA)
        and hasattr(m, "lora_a_stacked")
        and hasattr(m.base_layer, "weight")  # (the LM head's LogitsProcessor has none)
    }


def _linear_lora_ranks(model) -> set[int]:
    """The rank width of every linear LoRA layer's A slots."""
    return {
        a.shape[-2]
        for m in model.modules()
        if "Linear" in type(m).__name__ and hasattr(m, "lora_a_stacked")
        for a in m.lora_a_stacked
    }


def test_lora_dtype_and_max_lora_rank_reach_the_layers(tiny_model_dir, adapters):
    """--lora-dtype bfloat16 under a float32 model: the adapters' slots are
    bfloat16, the base weights float32; every slot is max_lora_rank wide."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = LLM(tiny_model_dir("llama"), enable_lora=True, lora_dtype="bfloat16", **ENGINE_KWARGS)
    try:
        (found,) = llm.llm_engine.collective_rpc("apply_model", args=(_lora_weight_dtypes,))
        assert found and {(a, w) for _, a, w in found} == {(torch.bfloat16, torch.float32)}
        (ranks,) = llm.llm_engine.collective_rpc("apply_model", args=(_linear_lora_ranks,))
        assert ranks == {16}  # the default max_lora_rank
        assert len(_tokens(llm, _lora(adapters, "a", 1))) == GREEDY.max_tokens
    finally:
        llm.llm_engine.shutdown()


def _merged_last_token_embedding(base: str, adapter: str | None) -> torch.Tensor:
    """transformers: the (merged peft) model's last hidden state at the last
    prompt token, L2-normalised."""
    import transformers as tf
    from peft import PeftModel

    model = tf.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    with torch.no_grad():
        hidden = model.model(torch.tensor([PROMPT["prompt_token_ids"]])).last_hidden_state
    return torch.nn.functional.normalize(hidden[0, -1], dim=-1)


def test_pooling_model_takes_adapters(tiny_model_dir, adapters):
    """An embedding model (a causal LM converted, last-token pooling) under
    adapters, mixed in one call with the base model: each vector equals
    transformers' on the merged peft model."""
    base = tiny_model_dir("llama")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        kwargs = dict(runner="pooling", convert="embed", enable_lora=True, max_loras=2)
        llm = LLM(base, **kwargs, **ENGINE_KWARGS)
    try:
        a, b = _lora(adapters, "a", 1), _lora(adapters, "b", 2)
        outs = llm.embed([PROMPT] * 3, use_tqdm=False, lora_request=[a, None, b])
        got = [torch.tensor(o.outputs.embedding) for o in outs]
        for vector, adapter in zip(got, (adapters["a"], None, adapters["b"])):
            want = _merged_last_token_embedding(base, adapter)
            torch.testing.assert_close(vector, want, atol=1e-5, rtol=0)
        assert not torch.allclose(got[0], got[1], atol=1e-3)
        assert llm.llm_engine.list_loras() == {1, 2}
    finally:
        llm.llm_engine.shutdown()
