"""EAGLE / EAGLE-3 speculative decoding end to end on both model runners
(tiny random targets and heads, float32, CPU, engine in-process): each case
runs on the V1 runner (VLLM_USE_V2_MODEL_RUNNER=0, EagleProposer) or Model
Runner V2 (the default for these targets, EagleSpeculator); llama-eagle on
both.

Greedy outputs must equal the same engine without speculation (random heads
are rarely right, so this mostly checks that rejection never changes
outputs); every draft the proposer makes must equal EAGLE's drafting
recomputed from scratch on transformers' modules over the known sequence
(RefDrafter), which checks the proposer's plumbing: the token/hidden-state
shift, positions of the later passes, the draft KV cache across steps,
prefill chunks and requests.
"""

from __future__ import annotations

import pytest

from tests.utils import make_tiny_model
from tests.v1.spec_decode.eagle_utils import RefDrafter, make_tiny_eagle, make_tiny_eagle3
from vllm import LLM, SamplingParams
from vllm.v1.spec_decode.eagle import EagleProposer
from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator

K = 3
AUX_IDS = [0, 1, 2]
PROMPTS = [
    [5, 17, 3, 99, 42, 7, 250, 11] * 3,
    [8, 9, 10, 11, 12],
    list(range(100, 137)),  # longer than a prefill chunk
]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    out: dict[str, str] = {}
    for kind in ("llama", "qwen2"):
        target = make_tiny_model(kind, str(tmp_path_factory.mktemp(kind)))
        out[kind] = target
        out[f"{kind}-eagle"] = make_tiny_eagle(target, str(tmp_path_factory.mktemp("e1")))
    # max_position_embeddings below the positions drafted: raised to the
    # target's max_model_len at start-up (else its rotary cache overflows).
    out["llama-eagle3"] = make_tiny_eagle3(
        out["llama"],
        str(tmp_path_factory.mktemp("e3")),
        draft_vocab_size=256,
        aux_layer_ids=AUX_IDS,
        max_position_embeddings=32,
    )
    out["qwen2-eagle3-noaux"] = make_tiny_eagle3(
        out["qwen2"], str(tmp_path_factory.mktemp("e3n")), use_aux_hidden_state=False
    )
    return out


def _llm(model: str, spec: dict | None = None) -> LLM:
    return LLM(
        model=model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        max_num_batched_tokens=32,  # the 37-token prompt prefills in two chunks
        max_num_seqs=4,
        block_size=16,
        speculative_config=spec,
    )


def _generate(llm: LLM) -> list[list[int]]:
    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def baseline(dirs):
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        for kind in ("llama", "qwen2"):
            llm = _llm(dirs[kind])
            out[kind] = _generate(llm)
            del llm
    return out


def _record_drafts(monkeypatch) -> list[tuple[list[int], list[int]]]:
    """(known tokens, drafts) of every row either runner's drafter drafted for."""
    calls: list[tuple[list[int], list[int]]] = []
    original = EagleProposer.propose

    def propose(self, inputs):
        drafts = original(self, inputs)
        batch = inputs.input_batch
        for row, d in enumerate(drafts):
            if d:
                n = int(batch.num_tokens_no_spec[row])
                calls.append((batch.token_ids_cpu[row, :n].tolist(), list(d)))
        return drafts

    original_v2 = EagleSpeculator.propose

    def propose_v2(self, batch, *args, **kwargs):
        drafts, num_drafts = original_v2(self, batch, *args, **kwargs)
        num_rejected, all_token_ids = args[5], args[7]
        # Known tokens after the step: its accepted inputs, then the emitted one.
        known = batch.num_computed_tokens_np + batch.num_scheduled_tokens - num_rejected + 1
        for i, n in enumerate(num_drafts.tolist()):
            if n:
                row = int(batch.idx_mapping_np[i])
                tokens = all_token_ids[row, : int(known[i])].tolist()
                calls.append((tokens, drafts[i, :n].tolist()))
        return drafts, num_drafts

    monkeypatch.setattr(EagleProposer, "propose", propose)
    monkeypatch.setattr(EagleSpeculator, "propose", propose_v2)
    return calls


@pytest.mark.parametrize(
    ("kind", "method", "head", "runner"),
    [
        ("llama", "eagle", "llama-eagle", "v1"),
        ("llama", "eagle", "llama-eagle", "v2"),
        ("llama", "eagle3", "llama-eagle3", "v2"),
        ("qwen2", "eagle", "qwen2-eagle", "v1"),
        ("qwen2", "eagle3", "qwen2-eagle3-noaux", "v2"),
    ],
)
def test_greedy_identical_and_drafts_match_reference(
    dirs, baseline, monkeypatch, kind, method, head, runner
):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", {"v1": "0", "v2": "1"}[runner])
    calls = _record_drafts(monkeypatch)
    spec = {"method": method, "model": dirs[head], "num_speculative_tokens": K}
    llm = _llm(dirs[kind], spec)
    assert llm.llm_engine.vllm_config.use_v2_model_runner is (runner == "v2")
    assert _generate(llm) == baseline[kind]
    llm.llm_engine.shutdown()
    del llm
    # Every request drafts after its prefill and after each decode step.
    assert len(calls) >= len(PROMPTS) * (MAX_TOKENS // (K + 1))
    assert all(len(d) == K for _, d in calls)
    ref = RefDrafter(dirs[kind], dirs[head], method, AUX_IDS)
    checked = 0
    for tokens, drafts in calls:
        want, margins = ref.drafts(tokens, K)
        for got, w, m in zip(drafts, want, margins):
            if m < 1e-4:  # a near-tie: either token is right
                break
            assert got == w, (tokens, drafts, want)
            checked += 1
    assert checked >= len(calls)  # at least the first draft of nearly every call


def _engine_config(model: str, spec: dict, **kwargs):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(
        model=model, device="cpu", speculative_config=spec, **kwargs
    ).create_engine_config()


def test_unsupported_target_architecture_refused_at_start_up(dirs, tmp_path):
    from tests.models.zoo_utils import build_zoo_model

    gemma = build_zoo_model("gemma2", str(tmp_path / "gemma2"))
    heads = {
        "eagle": make_tiny_eagle(gemma, str(tmp_path / "gemma2-eagle")),
        "eagle3": make_tiny_eagle3(gemma, str(tmp_path / "gemma2-eagle3")),
    }
    for method, head in heads.items():
        spec = {"method": method, "model": head, "num_speculative_tokens": 2}
        with pytest.raises(ValueError, match=rf"{method}.*target architecture 'Gemma2ForCausalLM'"):
            _engine_config(gemma, spec)


def test_bad_heads_refused_at_start_up(dirs, tmp_path):
    import json
    import shutil

    # A head for a narrower target.
    narrow = make_tiny_model(
        "llama",
        str(tmp_path / "narrow"),
        hidden_size=32,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    head = make_tiny_eagle(narrow, str(tmp_path / "narrow-eagle"))
    spec = {"method": "eagle", "model": head, "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match="expects target hidden size 32, but the target's is 64"):
        _engine_config(dirs["llama"], spec)
    # A head checkpoint whose architecture has no EAGLE head class.
    odd = shutil.copytree(dirs["llama-eagle"], tmp_path / "odd")
    cfg = json.loads((odd / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (odd / "config.json").write_text(json.dumps(cfg))
    spec = {"method": "eagle", "model": str(odd), "num_speculative_tokens": 2}
    with pytest.raises(ValueError, match=r"\['EagleGPT2LMHeadModel'\]\); no eagle head is built"):
        _engine_config(dirs["llama"], spec)


def test_eagle3_aux_depths_checked_at_load(dirs, tmp_path, monkeypatch):
    """A 2-layer target has depths 0..2; upstream's default (2, 1, -1) does not fit."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    head = make_tiny_eagle3(dirs["llama"], str(tmp_path / "e3-default"))
    spec = {"method": "eagle3", "model": head, "num_speculative_tokens": 2}
    with pytest.raises(Exception, match=r"3 distinct auxiliary hidden states at depths 0..2"):
        _llm(dirs["llama"], spec)


def test_eagle3_tp2_greedy_identical(dirs, baseline, monkeypatch):
    """Target and EAGLE-3 head both at TP=2 (multiprocess workers) on Model
    Runner V2 (the default; V1 at TP=2: test_eagle_acceptance.py): the aux
    states are the replicated residual stream, the draft vocabulary's logits
    are gathered before the d2t scatter."""
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    drafted: list[int] = []
    real = SpecDecodingStats.observe_draft

    def spy(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        drafted.append(num_draft_tokens)
        real(self, num_draft_tokens, num_accepted_tokens)

    monkeypatch.setattr(SpecDecodingStats, "observe_draft", spy)
    spec = {"method": "eagle3", "model": dirs["llama-eagle3"], "num_speculative_tokens": K}
    llm = LLM(
        model=dirs["llama"],
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        max_num_batched_tokens=32,
        max_num_seqs=4,
        block_size=16,
        tensor_parallel_size=2,
        speculative_config=spec,
        disable_log_stats=False,
    )
    try:
        assert llm.llm_engine.vllm_config.use_v2_model_runner
        assert _generate(llm) == baseline["llama"]
    finally:
        llm.llm_engine.shutdown()
    assert sum(drafted) > 0  # the workers' drafts were verified


def test_eagle_rename_leaves_the_cached_checkpoint_config_alone(dirs):
    """The EAGLE rename (LlamaForCausalLM -> EagleLlamaForCausalLM) works on a
    copy: get_config caches the checkpoint's config per path, and a second
    engine config (or a draft_model config of the same checkpoint) must see
    the checkpoint's own architectures."""
    from vllm.transformers_utils.config import get_config

    for _ in range(2):
        spec = {"method": "eagle", "model": dirs["llama-eagle"], "num_speculative_tokens": 2}
        draft = _engine_config(dirs["llama"], spec).speculative_config.draft_model_config
        assert draft.architectures == ["EagleLlamaForCausalLM"]
        assert draft.hf_config.architectures == ["EagleLlamaForCausalLM"]
    assert get_config(dirs["llama-eagle"], False, None).architectures == ["LlamaForCausalLM"]
