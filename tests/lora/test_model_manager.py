"""LoRA model manager (issue 18 items 1 and 3): our tiny Llama with its layers
wrapped by LoRA layers, three peft adapters in two slots.

- A step mixing adapters and the base model gives each prompt, row by row,
  transformers' logits of `PeftModel.merge_and_unload()` of its adapter
  (float32): the model-level parity check below the engine.
- LRU: the adapter a step uses keeps its slot; the least recently used one
  not in use is evicted; a pinned one never is; max_cpu_loras bounds the
  adapters kept loaded.
"""

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
from tests.lora.peft_utils import LLAMA_TARGETS
from tests.utils import make_tiny_model
from vllm.lora.layers import BaseLayerWithLoRA
from vllm.lora.model_manager import LRUCacheLoRAModelManager, create_lora_manager
from vllm.utils.cache import LRUCache

SPECS = {"a": (8, 1), "b": (16, 2), "c": (8, 3)}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> str:
    return make_tiny_model("llama", str(tmp_path_factory.mktemp("mm-base")))


@pytest.fixture(scope="module")
def adapters(base_dir, tmp_path_factory) -> dict[str, str]:
    """a, b: every attention and MLP projection; c also the input embedding
    and the LM head (peft's lora_embedding_A/B and a Linear LoRA on lm_head)."""
    out = str(tmp_path_factory.mktemp("mm-adapters"))
    paths = build_adapters(base_dir, out, {k: SPECS[k] for k in ("a", "b")})
    targets = [*LLAMA_TARGETS, "embed_tokens", "lm_head"]
    paths.update(build_adapters(base_dir, out, {"c": SPECS["c"]}, target_modules=targets))
    return paths


@pytest.fixture(scope="module")
def setup(base_dir):
    """max_loras=2 slots, 3 adapters kept in CPU memory."""
    return lora_model_and_worker(base_dir, max_loras=2, max_cpu_loras=3)


@pytest.fixture
def reqs(adapters):
    return {name: request(name, i + 1, adapters[name]) for i, name in enumerate(SPECS)}


def _manager(worker) -> LRUCacheLoRAModelManager:
    manager = worker._adapter_manager
    assert isinstance(manager, LRUCacheLoRAModelManager)
    return manager


def _slot_of(worker, lora_id: int) -> int:
    return _manager(worker).lora_index_to_id.index(lora_id)


def test_layers_replaced_and_packed_modules(setup):
    model, worker, _ = setup
    manager = _manager(worker)
    layer = model.model.layers[0]
    for module in (
        layer.self_attn.qkv_proj,
        layer.self_attn.o_proj,
        layer.mlp.gate_up_proj,
        layer.mlp.down_proj,
        model.model.embed_tokens,
        model.logits_processor,
    ):
        assert isinstance(module, BaseLayerWithLoRA)
    assert "lm_head" in manager.modules and "model.embed_tokens" in manager.modules
    assert manager.packed_modules["model.layers.1.self_attn.qkv_proj"] == [
        f"model.layers.1.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")
    ]
    assert model.lora_manager is manager
    assert manager.lora_slots == 2 and manager.capacity == 3


def test_mixed_batch_equals_merged_peft_per_row(setup, base_dir, adapters, reqs):
    """Three adapters (more than the 2 slots) and the base model over two
    steps; every prompt's logits equal the merged peft model's."""
    model, worker, config = setup
    worker.remove_all_adapters()
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 512, (n,), generator=gen).tolist() for n in (7, 11, 5, 9)]
    steps = [
        [(prompts[0], reqs["a"]), (prompts[1], None), (prompts[2], reqs["b"])],
        # c needs a slot: b (used last step, not this one) is evicted, a stays.
        [(prompts[3], reqs["c"]), (prompts[1], reqs["a"]), (prompts[2], None)],
    ]
    for batch in steps:
        outs = run_step(model, config, worker, batch)
        for (tokens, req), ours in zip(batch, outs):
            ref = merged_peft_logits(
                base_dir, None if req is None else adapters[req.lora_name], tokens
            )
            torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)
    # The adapters change the output (the check above is not vacuous).
    base = merged_peft_logits(base_dir, None, prompts[3])
    assert (base - merged_peft_logits(base_dir, adapters["c"], prompts[3])).abs().max() > 1e-2


def test_lru_keeps_in_use_slots_and_evicts_oldest(setup, reqs):
    _, worker, _ = setup
    manager = _manager(worker)
    worker.remove_all_adapters()
    worker.set_active_adapters({reqs["a"], reqs["b"]}, None)
    slot_b = _slot_of(worker, 2)
    # b in use again, c new: a (least recently used, idle) loses its slot,
    # b keeps the slot it had.
    worker.set_active_adapters({reqs["b"], reqs["c"]}, None)
    assert _slot_of(worker, 2) == slot_b
    assert set(manager.lora_index_to_id) == {2, 3}
    assert worker.list_adapters() == {1, 2, 3}  # a still loaded in CPU memory
    # The step lists b first this time: order within a step does not matter.
    worker.set_active_adapters({reqs["a"], reqs["c"]}, None)
    assert set(manager.lora_index_to_id) == {1, 3}
    with pytest.raises(RuntimeError, match="greater than the number of GPU LoRA slots"):
        worker.set_active_adapters({reqs["a"], reqs["b"], reqs["c"]}, None)


def test_adding_between_steps_never_moves_an_adapter_in_use(setup, reqs):
    """add_lora while a and b decode: c is loaded but takes no slot of theirs."""
    _, worker, _ = setup
    manager = _manager(worker)
    worker.remove_all_adapters()
    worker.set_active_adapters({reqs["a"], reqs["b"]}, None)
    before = list(manager.lora_index_to_id)
    assert worker.add_adapter(reqs["c"]) is True
    assert manager.lora_index_to_id == before and 3 in worker.list_adapters()
    # Next step without b: c takes b's slot; a keeps its own.
    worker.set_active_adapters({reqs["a"], reqs["c"]}, None)
    assert manager.lora_index_to_id == [3 if x == 2 else x for x in before]


def test_pinned_adapter_never_evicted(setup, reqs):
    _, worker, _ = setup
    manager = _manager(worker)
    worker.remove_all_adapters()
    worker.set_active_adapters({reqs["a"]}, None)
    assert worker.pin_adapter(1)
    slot_a = _slot_of(worker, 1)
    for step in ({"b"}, {"c"}, {"b"}, {"c"}):
        worker.set_active_adapters({reqs[n] for n in step}, None)
        assert _slot_of(worker, 1) == slot_a
    # The CPU cache is full (3): a fourth adapter evicts the oldest unpinned one.
    fourth = request("d", 4, reqs["a"].lora_path)
    worker.set_active_adapters({fourth}, None)
    assert 1 in worker.list_adapters() and len(worker.list_adapters()) == 3
    assert _slot_of(worker, 1) == slot_a
    with pytest.raises(ValueError, match="Pinning failed. LoRA 99 is not registered."):
        worker.pin_adapter(99)
    assert manager.lora_slots == 2


def test_max_cpu_loras_bounds_loaded_adapters(base_dir, adapters):
    _, worker, _ = lora_model_and_worker(base_dir, max_loras=1, max_cpu_loras=2)
    ids = {name: i + 1 for i, name in enumerate(SPECS)}
    for name in ("a", "b", "c"):
        worker.set_active_adapters({request(name, ids[name], adapters[name])}, None)
        assert _manager(worker).lora_index_to_id == [ids[name]]
    assert worker.list_adapters() == {2, 3}  # a, least recently used, unloaded
    assert worker.remove_adapter(2) and not worker.remove_adapter(2)
    assert worker.list_adapters() == {3}


def test_plain_worker_keeps_exactly_the_step_adapters(base_dir, adapters):
    _, worker, _ = lora_model_and_worker(base_dir, max_loras=2, max_cpu_loras=2, lru=False)
    ra, rb, rc = (request(n, i + 1, adapters[n]) for i, n in enumerate(SPECS))
    worker.set_active_adapters({ra, rb}, None)
    assert worker.list_adapters() == {1, 2}
    worker.set_active_adapters({rc}, None)
    assert worker.list_adapters() == {3}
    with pytest.raises(NotImplementedError, match="Use LRUCacheLoRAModelManager"):
        worker.pin_adapter(3)


def test_target_modules_restricts_wrapped_layers(base_dir, adapters):
    model, worker, config = lora_model_and_worker(
        base_dir, max_loras=1, max_cpu_loras=1, target_modules=["o_proj"]
    )
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.o_proj, BaseLayerWithLoRA)
    assert not isinstance(layer.self_attn.qkv_proj, BaseLayerWithLoRA)
    assert not isinstance(layer.mlp.down_proj, BaseLayerWithLoRA)
    # An adapter over every projection loads; only o_proj's LoRA is applied.
    worker.set_active_adapters({request("a", 1, adapters["a"])}, None)
    assert set(_manager(worker).modules) == {f"model.layers.{i}.self_attn.o_proj" for i in (0, 1)}


def test_models_that_cannot_take_lora_refused(base_dir):
    from torch import nn

    with pytest.raises(ValueError, match="is not supported for LoRA"):
        create_lora_manager(nn.Linear(2, 2), 1, 8, 8, None, None, torch.device("cpu"))  # type: ignore[arg-type]


def test_lru_cache_order_and_pins():
    removed: list[int] = []

    class Cache(LRUCache[int, str]):
        def _on_remove(self, key: int, value: str | None) -> None:
            removed.append(key)

    cache = Cache(2)
    cache[1], cache[2] = "x", "y"
    cache.touch(1)
    cache[3] = "z"  # evicts 2, the least recently used
    assert removed == [2] and cache.order == [1, 3]
    cache.pin(1)
    cache[4] = "w"  # 1 pinned: 3 goes
    assert removed == [2, 3] and 1 in cache
    cache.pin(4)
    with pytest.raises(RuntimeError, match="All items are pinned"):
        cache[5] = "v"
    with pytest.raises(ValueError, match="Cannot pin key: 9 not in cache."):
        cache.pin(9)
    cache.clear()
    assert len(cache) == 0 and removed == [2, 3, 1, 4]


def test_dummy_loras_are_zero_and_fit_every_layer(setup, base_dir):
    """Warm-up adapters (add_dummy_lora) cover every adapted module at its full
    size, pass the fit check, and leave the output equal to the base model's."""
    model, worker, config = setup
    worker.remove_all_adapters()
    manager = _manager(worker)
    with worker.dummy_lora_cache():
        assert worker.add_dummy_lora(request("w1", 11, "/warmup"), rank=8)
        assert worker.add_dummy_lora(request("w2", 12, "/warmup"), rank=8)
        assert not worker.add_dummy_lora(request("w2", 12, "/warmup"), rank=8)
    first, second = manager.get_adapter(11), manager.get_adapter(12)
    assert first is not None and second is not None
    assert set(first.loras) == set(manager.modules)
    assert second.get_lora("lm_head").lora_a is first.get_lora("lm_head").lora_a  # cached
    assert worker.get_dummy_lora_warmup_rank(8) == 8
    tokens = list(range(1, 9))
    batch = [(tokens, request("w1", 11, "/warmup")), (tokens, None)]
    dummy, base = run_step(model, config, worker, batch)
    torch.testing.assert_close(dummy, base, atol=0, rtol=0)
    worker.remove_all_adapters()


def test_everything_pinned_still_serves_a_new_adapter(base_dir, adapters):
    """max_loras = max_cpu_loras = 2, both pinned: a step with a third adapter
    still runs (upstream raises 'All items are pinned' mid-step). The new one
    is loaded beyond max_cpu_loras and displaces a pinned one from its slot
    for the step; both pinned adapters stay loaded, and the pinned one gets
    its slot back (pinned again) when next used."""
    _, worker, _ = lora_model_and_worker(base_dir, max_loras=2, max_cpu_loras=2)
    ra, rb, rc = (request(n, i + 1, adapters[n]) for i, n in enumerate(SPECS))
    worker.set_active_adapters([ra, rb], None)
    assert worker.pin_adapter(1) and worker.pin_adapter(2)
    worker.set_active_adapters([rc, ra], None)
    manager = _manager(worker)
    assert set(manager.lora_index_to_id) == {1, 3} and worker.list_adapters() == {1, 2, 3}
    worker.set_active_adapters([rb], None)  # c (unpinned, idle) makes room again
    assert worker.list_adapters() == {1, 2} and set(manager.lora_index_to_id) == {1, 2}
    assert manager._active_adapters.pinned_items == {1, 2}
