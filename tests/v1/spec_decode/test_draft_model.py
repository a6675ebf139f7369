"""Draft-model speculative decoding on the V1 runner (issue 19): greedy outputs
are token-identical to the same engine without speculation, with chunked
prefill and prefix caching on; a draft equal to the target has every draft
accepted (which only holds if the draft's KV cache, positions and slots are
exact, prefix-cached blocks included); a different draft's drafts are its own
greedy continuation (transformers' generate on the draft checkpoint);
preemption and TP=2 stay identical; start-up refusals name the problem."""

from __future__ import annotations

import glob
import os
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

from tests.utils import TINY_VOCAB, make_tiny_model, model_greedy
from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.inputs import TokensPrompt
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.spec_decode.metrics import SpecDecodingStats

K = 3  # num_speculative_tokens
_rng = random.Random(0)
# Short, long (chunked: 16-token steps) and medium prompts, one repetitive.
PROMPTS = [[_rng.randrange(1, TINY_VOCAB) for _ in range(n)] for n in (5, 30, 12)]
PROMPTS.append([7, 8, 9, 10] * 5)
# Twice as many for the preemption test.
MORE_PROMPTS = PROMPTS + [[t % (TINY_VOCAB - 1) + 1 for t in p] for p in PROMPTS]
GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
ENGINE = dict(max_num_batched_tokens=16, enable_prefix_caching=True)


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> str:
    return make_tiny_model("llama", str(tmp_path_factory.mktemp("target")))


@pytest.fixture(scope="module")
def truncated_draft(target, tmp_path_factory) -> str:
    """The target's first layer (+ its norm and LM head): a different model
    of the same vocabulary and KV page shape that agrees with it only sometimes."""
    from transformers import AutoModelForCausalLM

    out = str(tmp_path_factory.mktemp("draft"))
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    model.model.layers = model.model.layers[:1]
    model.config.num_hidden_layers = 1
    model.save_pretrained(out, safe_serialization=True)
    for name in glob.glob(os.path.join(target, "*token*")):
        shutil.copy(name, out)
    return out


@contextmanager
def _llm(model: str, spec: dict[str, Any] | None = None, **kwargs: Any) -> Iterator[LLM]:
    """A float32 V1-runner engine whose engine core runs in this process (so
    the spies below see the scheduler and, at TP=1, the runner)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0"}
    old = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    args: dict[str, Any] = dict(
        model=model, dtype="float32", max_model_len=128, seed=0, disable_log_stats=False
    )
    if spec is not None:
        args["speculative_config"] = {"method": "draft_model", "num_speculative_tokens": K, **spec}
    llm = None
    try:
        llm = LLM(**args, **kwargs)
        assert not llm.llm_engine.vllm_config.use_v2_model_runner
        yield llm
    finally:
        if llm is not None:
            llm.llm_engine.shutdown()
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _generate(llm: LLM, prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], GREEDY, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], [o.num_cached_tokens or 0 for o in outs]


def _count_acceptance(monkeypatch) -> list[int]:
    """[drafted, accepted] over every verified step (the scheduler's stats)."""
    counts = [0, 0]
    real = SpecDecodingStats.observe_draft

    def spy(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        counts[0] += num_draft_tokens
        counts[1] += num_accepted_tokens
        real(self, num_draft_tokens, num_accepted_tokens)

    monkeypatch.setattr(SpecDecodingStats, "observe_draft", spy)
    return counts


@pytest.fixture(scope="module")
def reference_more(target) -> list[list[int]]:
    """The no-speculation outputs of MORE_PROMPTS (PROMPTS first)."""
    with _llm(target, **ENGINE) as llm:
        return _generate(llm, MORE_PROMPTS)[0]


@pytest.fixture(scope="module")
def reference(reference_more) -> list[list[int]]:
    return reference_more[: len(PROMPTS)]


def test_draft_equal_to_target_accepts_every_draft(target, reference, monkeypatch):
    """Identical outputs and 100% acceptance, also when the second round of
    the same prompts starts from prefix-cached blocks (target and draft KV)."""
    counts = _count_acceptance(monkeypatch)
    with _llm(target, {"model": target}, **ENGINE) as llm:
        assert _generate(llm, PROMPTS)[0] == reference
        assert counts[0] > 0 and counts[1] == counts[0], counts
        first_round = list(counts)
        outputs, cached = _generate(llm, PROMPTS)
    assert outputs == reference
    assert cached[1] >= 16 and cached[3] >= 16, cached  # the long prompts hit the cache
    assert counts[0] > first_round[0] and counts[1] == counts[0], counts


def test_different_draft_is_lossless_and_drafts_its_greedy(
    target, truncated_draft, reference, monkeypatch
):
    """A different draft: outputs identical, some drafts accepted and some
    not, and every draft list is the draft model's own greedy continuation
    of the row's known tokens (pass 1 + the one-token passes are exact)."""
    counts = _count_acceptance(monkeypatch)
    proposals: list[tuple[list[int], list[int]]] = []
    real = DraftModelProposer.propose

    def spy(self, inputs):
        drafts = real(self, inputs)
        batch = inputs.input_batch
        for row, row_drafts in enumerate(drafts):
            if row_drafts:
                known = int(batch.num_tokens_no_spec[row])
                proposals.append((batch.token_ids_cpu[row, :known].tolist(), row_drafts))
        return drafts

    monkeypatch.setattr(DraftModelProposer, "propose", spy)
    with _llm(target, {"model": truncated_draft}, **ENGINE) as llm:
        assert _generate(llm, PROMPTS)[0] == reference
    assert 0 < counts[1] < counts[0], counts
    from transformers import AutoModelForCausalLM

    hf_draft = AutoModelForCausalLM.from_pretrained(truncated_draft, dtype=torch.float32).eval()
    assert len(proposals) > 20
    for context, drafts in proposals:
        assert len(drafts) == K
        assert model_greedy(hf_draft, [context], K)[0] == drafts, context


def test_preemption_keeps_outputs_identical(target, reference_more, monkeypatch):
    """A KV cache too small for the batch: requests are preempted and
    recomputed (target and draft KV alike); outputs equal the no-spec run."""
    counts = _count_acceptance(monkeypatch)
    preempted: list[str] = []
    real = Scheduler._preempt_request

    def spy(self, request, timestamp):
        preempted.append(request.request_id)
        real(self, request, timestamp)

    monkeypatch.setattr(Scheduler, "_preempt_request", spy)
    with _llm(target, {"model": target}, num_gpu_blocks_override=10, **ENGINE) as llm:
        assert _generate(llm, MORE_PROMPTS)[0] == reference_more
    assert preempted, "no request was preempted"
    assert counts[0] > 0 and counts[1] == counts[0], counts


def test_tp2_draft_and_target(target, truncated_draft, reference, monkeypatch):
    """Target and draft both at TP=2 (multiprocess workers): identical outputs."""
    counts = _count_acceptance(monkeypatch)
    with _llm(target, {"model": truncated_draft}, tensor_parallel_size=2, **ENGINE) as llm:
        config = llm.llm_engine.vllm_config
        assert config.speculative_config.draft_parallel_config.tensor_parallel_size == 2
        assert _generate(llm, PROMPTS)[0] == reference
    assert 0 < counts[1] < counts[0], counts


def test_draft_tp_must_equal_target_tp(target):
    args = EngineArgs(
        model=target,
        device="cpu",
        tensor_parallel_size=2,
        speculative_config={
            "method": "draft_model",
            "model": target,
            "num_speculative_tokens": K,
            "draft_tensor_parallel_size": 1,
        },
    )
    with pytest.raises(ValueError, match="must be the same. Got 1 and 2"):
        args.create_engine_config()


def test_draft_with_other_vocab_refused(target, tmp_path):
    other = make_tiny_model("llama", str(tmp_path / "d"), seed=1, vocab_size=TINY_VOCAB + 64)
    args = EngineArgs(
        model=target,
        device="cpu",
        speculative_config={"method": "draft_model", "model": other, "num_speculative_tokens": K},
    )
    with pytest.raises(ValueError, match="same vocabulary size"):
        args.create_engine_config()


def test_draft_with_other_kv_page_shape_refused(target, tmp_path):
    """4 KV heads against the target's 2: the draft cannot share the target's
    KV cache group; refused at start-up naming both shapes."""
    other = make_tiny_model("llama", str(tmp_path / "d"), seed=1, num_key_value_heads=4)
    match = r"KV cache pages .*4, 16.* differ .*2, 16"
    with pytest.raises(NotImplementedError, match=match), _llm(target, {"model": other}):
        pass


def test_probabilistic_draft_sampling_refused(target):
    spec = {"model": target, "draft_sample_method": "probabilistic"}
    with pytest.raises(NotImplementedError, match="draft_sample_method"), _llm(target, spec):
        pass
