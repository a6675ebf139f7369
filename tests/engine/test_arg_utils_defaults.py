"""The defaults `EngineArgs.create_engine_config` derives, each as upstream v0.28
derives it (vllm/engine/arg_utils.py `_set_default_max_num_seqs_and_batched_tokens_args`,
`_set_default_chunked_prefill_and_prefix_caching_args`; vllm/config/model.py
`_get_and_verify_max_len`), and the `LLM(model, max_num_batched_tokens=4)` run the
issue found refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vllm import LLM, SamplingParams
from vllm.config import SchedulerConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.inputs import TokensPrompt
from vllm.usage.usage_lib import UsageContext

LLM_CLASS, SERVER = UsageContext.LLM_CLASS, UsageContext.OPENAI_API_SERVER


def _sched(model: str, usage: UsageContext | None = LLM_CLASS, **kwargs) -> SchedulerConfig:
    args = EngineArgs(model=model, dtype="float32", **kwargs)
    return args.create_engine_config(usage).scheduler_config


# ---- max_num_seqs / max_num_batched_tokens ---------------------------------------------
def test_defaulted_max_num_seqs_is_capped_at_the_users_token_budget(tiny_model_dir):
    sc = _sched(tiny_model_dir("llama"), max_num_batched_tokens=4)
    assert (sc.max_num_batched_tokens, sc.max_num_seqs) == (4, 4)
    # The server's default (128 seqs on CPU) is capped the same way.
    sc = _sched(tiny_model_dir("llama"), SERVER, max_num_batched_tokens=100)
    assert (sc.max_num_batched_tokens, sc.max_num_seqs) == (100, 100)


def test_user_values_are_never_changed(tiny_model_dir):
    sc = _sched(tiny_model_dir("llama"), max_num_batched_tokens=100, max_num_seqs=3)
    assert (sc.max_num_batched_tokens, sc.max_num_seqs) == (100, 3)
    # Both set and inconsistent: refused as upstream's SchedulerConfig does.
    with pytest.raises(
        ValueError,
        match=r"max_num_batched_tokens \(4\) must be greater than "
        r"or equal to max_num_seqs \(8\)",
    ):
        _sched(tiny_model_dir("llama"), max_num_batched_tokens=4, max_num_seqs=8)


def test_defaulted_token_budget_is_at_most_max_num_seqs_times_max_model_len(tiny_model_dir):
    # Upstream: min(max_num_seqs * max_model_len, default) when the budget is defaulted.
    sc = _sched(tiny_model_dir("llama"), max_model_len=64, max_num_seqs=2)
    assert (sc.max_num_batched_tokens, sc.max_num_seqs) == (128, 2)
    # Not when the user set the budget.
    sc = _sched(
        tiny_model_dir("llama"), max_model_len=64, max_num_seqs=2, max_num_batched_tokens=1000
    )
    assert sc.max_num_batched_tokens == 1000


def test_without_chunked_prefill_the_defaulted_budget_covers_max_model_len(tiny_model_dir):
    model = tiny_model_dir("llama")
    long_ctx = {"max_position_embeddings": 8192}
    sc = _sched(model, None, enable_chunked_prefill=False, hf_overrides=long_ctx)
    assert sc.max_model_len == 8192 and sc.max_num_batched_tokens == 8192
    assert sc.enable_chunked_prefill is False
    # With chunking (the default) the usage-context default stands.
    sc = _sched(model, None, hf_overrides=long_ctx)
    assert sc.max_num_batched_tokens == SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS
    assert sc.enable_chunked_prefill is True
    # A budget the user set below max_model_len without chunking is refused.
    with pytest.raises(ValueError, match="smaller than max_model_len"):
        _sched(
            model,
            None,
            enable_chunked_prefill=False,
            hf_overrides=long_ctx,
            max_num_batched_tokens=1024,
        )


def test_unknown_usage_context_uses_the_scheduler_config_defaults(tiny_model_dir):
    sc = _sched(tiny_model_dir("llama"), None)
    assert (sc.max_num_batched_tokens, sc.max_num_seqs) == (
        SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS,
        SchedulerConfig.DEFAULT_MAX_NUM_SEQS,
    )


def test_resolved_defaults_are_written_back_and_stable(tiny_model_dir):
    args = EngineArgs(model=tiny_model_dir("llama"), max_num_batched_tokens=4)
    first = args.create_engine_config(LLM_CLASS)
    assert (args.max_num_seqs, args.enable_chunked_prefill, args.enable_prefix_caching) == (
        4,
        True,
        True,
    )
    second = args.create_engine_config(LLM_CLASS)
    assert first.scheduler_config == second.scheduler_config


def test_throughput_mode_doubles_only_the_defaults(tiny_model_dir):
    model = tiny_model_dir("llama")
    sc = _sched(model, performance_mode="throughput")
    assert (sc.max_num_batched_tokens, sc.max_num_seqs) == (2 * 4096, 2 * 256)
    sc = _sched(model, SERVER, performance_mode="throughput", max_num_seqs=100)
    assert (sc.max_num_batched_tokens, sc.max_num_seqs) == (2 * 2048, 100)
    # Then the usual caps: <= max_num_seqs * max_model_len.
    sc = _sched(model, performance_mode="throughput", max_model_len=16, max_num_seqs=4)
    assert sc.max_num_batched_tokens == 64
    with pytest.raises(ValueError, match="--performance-mode"):
        EngineArgs(model=model, performance_mode="fastest").create_engine_config()


def test_interactivity_mode_captures_every_small_batch_size(tiny_model_dir):
    from vllm.config import CompilationConfig

    model = tiny_model_dir("llama")
    cc = (
        EngineArgs(model=model, performance_mode="interactivity")
        .create_engine_config(LLM_CLASS)
        .compilation_config
    )
    cc.set_cudagraph_sizes(max_num_batched_tokens=8192, max_num_seqs=256)
    assert cc.cudagraph_capture_sizes[:33] == list(range(1, 33)) + [40]
    assert cc.cudagraph_capture_sizes[-1] == 512
    balanced = EngineArgs(model=model).create_engine_config(LLM_CLASS).compilation_config
    balanced.set_cudagraph_sizes(max_num_batched_tokens=8192, max_num_seqs=256)
    assert balanced.cudagraph_capture_sizes[:5] == [1, 2, 4, 8, 16]
    # Sizes the user gives are kept as they are.
    user = (
        EngineArgs(
            model=model,
            performance_mode="interactivity",
            compilation_config={"cudagraph_capture_sizes": [1, 8]},
        )
        .create_engine_config(LLM_CLASS)
        .compilation_config
    )
    user.set_cudagraph_sizes(max_num_batched_tokens=8192, max_num_seqs=256)
    assert user.cudagraph_capture_sizes == [1, 8]
    assert CompilationConfig().performance_mode == "balanced"


# ---- chunked prefill / prefix caching --------------------------------------------------
def _config_only_model(kind: str, out_dir: Path) -> str:
    """A checkpoint folder with just the config (ModelConfig reads no weights)."""
    import transformers as tf

    from tests.models.zoo_utils import ZOO

    spec = ZOO[kind]
    getattr(tf, spec.config_cls)(**spec.kwargs, architectures=[spec.model_cls]).save_pretrained(
        out_dir
    )
    return str(out_dir)


@pytest.mark.parametrize(("kind", "prefix_caching"), [("mamba", False), ("qwen3_5", False)])
def test_prefix_caching_defaults_off_for_hybrid_and_attention_free(tmp_path, kind, prefix_caching):
    model = _config_only_model(kind, tmp_path)
    config = EngineArgs(model=model).create_engine_config(LLM_CLASS)
    assert config.cache_config.enable_prefix_caching is prefix_caching
    assert config.scheduler_config.enable_chunked_prefill is True
    # An explicit value is kept.
    config = EngineArgs(model=model, enable_prefix_caching=True).create_engine_config(LLM_CLASS)
    assert config.cache_config.enable_prefix_caching is True


def test_decoder_models_default_to_chunked_prefill_and_prefix_caching(tiny_model_dir):
    config = EngineArgs(model=tiny_model_dir("qwen2")).create_engine_config(SERVER)
    assert config.cache_config.enable_prefix_caching is True
    assert config.scheduler_config.enable_chunked_prefill is True


# ---- max_model_len from the config -------------------------------------------------------
def _copy_with(
    model_dir: str, out: Path, config: dict | None = None, tokenizer_config: dict | None = None
) -> str:
    shutil.copytree(model_dir, out)
    for name, patch in (("config.json", config), ("tokenizer_config.json", tokenizer_config)):
        if patch:
            path = out / name
            data = json.loads(path.read_text()) if path.exists() else {}
            path.write_text(json.dumps({**data, **patch}))
    return str(out)


def test_max_model_len_defaults_to_the_config_and_is_capped_by_the_tokenizer(
    tiny_model_dir, tmp_path
):
    base = tiny_model_dir("llama")
    assert (
        _sched(base).max_model_len
        == json.loads((Path(base) / "config.json").read_text())["max_position_embeddings"]
    )
    capped = _copy_with(base, tmp_path / "capped", tokenizer_config={"model_max_length": 100})
    assert _sched(capped).max_model_len == 100
    with pytest.raises(ValueError, match=r"max_model_len \(200\) is greater than the derived"):
        _sched(capped, max_model_len=200)


def test_max_model_len_scales_with_rope_scaling(tiny_model_dir, tmp_path):
    base = tiny_model_dir("llama")
    yarn = _copy_with(
        base,
        tmp_path / "yarn",
        config={
            "max_position_embeddings": 1024,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 256,
            },
        },
    )
    assert _sched(yarn).max_model_len == 1024  # 256 * 4
    linear = _copy_with(
        base,
        tmp_path / "linear",
        config={
            "max_position_embeddings": 300,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
    )
    assert _sched(linear).max_model_len == 600


# ---- the LLM run ---------------------------------------------------------------------------
def _greedy(llm: LLM, prompts: list[list[int]]) -> list[list[int]]:
    sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def test_llm_with_only_max_num_batched_tokens_runs_chunked(tiny_model_dir, monkeypatch):
    """`LLM(model, max_num_batched_tokens=4)` runs (max_num_seqs defaults to 4), the
    scheduler really spends at most 4 tokens a step (a 20-token prompt takes five
    prefill steps), and greedy tokens equal the default settings'."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # reach the scheduler
    model = tiny_model_dir("llama")
    prompts = [[(7 * i + 3 * j) % 500 + 1 for j in range(20)] for i in range(3)]
    common = dict(
        model=model, dtype="float32", max_model_len=64, seed=0, kv_cache_memory_bytes=8 * 2**20
    )
    expected = _greedy(LLM(**common), prompts)

    llm = LLM(**common, max_num_batched_tokens=4)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert (scheduler.max_num_scheduled_tokens, scheduler.max_num_running_reqs) == (4, 4)
    steps: list[dict[str, int]] = []
    real_schedule = scheduler.schedule

    def spy():
        out = real_schedule()
        steps.append(dict(out.num_scheduled_tokens))
        return out

    monkeypatch.setattr(scheduler, "schedule", spy)
    assert _greedy(llm, prompts) == expected
    assert steps and max(sum(s.values()) for s in steps) <= 4
    # The first request alone fills the first steps: its 20-token prompt takes five
    # 4-token chunks (ignoring the budget would prefill it in one step).
    first = next(iter(steps[0]))
    assert [s.get(first) for s in steps[:5]] == [4, 4, 4, 4, 4]
    # Every prompt token and 7 decode tokens per request were computed once.
    assert sum(sum(s.values()) for s in steps) == 3 * 20 + 3 * 7
