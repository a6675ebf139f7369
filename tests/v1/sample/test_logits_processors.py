"""The V1 sampler's logits edits (allowed tokens, bad words, min_tokens, logit
bias, repetition / frequency / presence penalties) through the real persistent
batch, against transformers' logits processors applied row by row."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensLogitsProcessor,
)

from tests.utils import TINY_VOCAB
from vllm.config import ModelConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.sample.logits_processor import build_logitsprocs
from vllm.v1.sample.sampler import Sampler
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

V = TINY_VOCAB
EOS = 0
CPU = torch.device("cpu")

# (prompt, outputs so far, params) per request. Every feature appears, some
# requests combine several, and one has none.
REQUESTS = {
    "plain": ([5, 6, 7], [8, 9], dict()),
    "rep": ([10, 11, 12, 11], [13, 10], dict(repetition_penalty=1.7)),
    "freq": ([20, 21], [22, 22, 23, 22], dict(frequency_penalty=0.8, presence_penalty=-0.5)),
    "allowed": ([30], [31], dict(allowed_token_ids=[3, 30, 31, 400])),
    "bad": ([40, 41], [42, 43], dict()),  # bad words set directly below
    "min": ([50], [51], dict(min_tokens=4, stop_token_ids=[7, 9])),
    "bias": ([60], [], dict(logit_bias={1: 5.0, 61: -3.5, 499: 20.0})),
    "mix": (
        [70, 71, 72],
        [73, 70, 73],
        dict(repetition_penalty=0.6, presence_penalty=1.2, logit_bias={70: 2.0}, min_tokens=5),
    ),
}
BAD_WORDS = {"bad": [[43, 44], [42, 43, 45], [46], [99, 43, 47]]}


@pytest.fixture(scope="module")
def vllm_config(tiny_model_dir):
    return VllmConfig(model_config=ModelConfig(model=tiny_model_dir("llama"), dtype="float32"))


def _params(req_id: str) -> SamplingParams:
    params = SamplingParams(temperature=0.0, **REQUESTS[req_id][2])
    params.update_from_generation_config({}, EOS)
    if req_id in BAD_WORDS:
        params._bad_words_token_ids = BAD_WORDS[req_id]
    return params


def _state(req_id: str) -> CachedRequestState:
    prompt, outputs, _ = REQUESTS[req_id]
    return CachedRequestState(
        req_id=req_id,
        prompt_token_ids=list(prompt),
        mm_features=[],
        sampling_params=_params(req_id),
        generator=None,
        block_ids=([],),
        num_computed_tokens=0,
        output_token_ids=list(outputs),
    )


def _batch(vllm_config) -> InputBatch:
    return InputBatch(
        max_num_reqs=16,
        max_model_len=64,
        max_num_batched_tokens=64,
        device=CPU,
        pin_memory=False,
        vocab_size=V,
        block_sizes=[16],
        logitsprocs=build_logitsprocs(vllm_config, CPU, False),
    )


def _reference_row(logits: torch.Tensor, state: CachedRequestState) -> torch.Tensor:
    """transformers' processors (manual OpenAI formula for frequency/presence,
    which transformers lacks), in upstream's order."""
    params = state.sampling_params
    prompt, outputs = state.prompt_token_ids, state.output_token_ids
    all_ids = torch.tensor([prompt + outputs])
    out_ids = torch.tensor([outputs], dtype=torch.long)
    scores = logits.unsqueeze(0).clone()
    if params.allowed_token_ids:
        suppress = sorted(set(range(V)) - set(params.allowed_token_ids))
        scores = SuppressTokensLogitsProcessor(suppress)(all_ids, scores)
    if params.bad_words_token_ids:
        scores = NoBadWordsLogitsProcessor(params.bad_words_token_ids)(out_ids, scores)
    if params.min_tokens:
        scores = MinNewTokensLengthLogitsProcessor(
            len(prompt), params.min_tokens, sorted(params.all_stop_token_ids)
        )(all_ids, scores)
    if params.logit_bias:
        bias = [[[t], b] for t, b in params.logit_bias.items()]
        scores = SequenceBiasLogitsProcessor(bias)(all_ids, scores)
    if params.repetition_penalty != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(params.repetition_penalty)(all_ids, scores)
    for token, count in Counter(outputs).items():
        scores[0, token] -= params.frequency_penalty * count + params.presence_penalty
    return scores[0]


def _check(batch: InputBatch, logits: torch.Tensor) -> None:
    ours = Sampler().apply_logits_processors(logits.clone(), batch.sampling_metadata)
    for row, req_id in enumerate(batch.req_ids):
        ref = _reference_row(logits[row], _STATES[req_id])
        assert torch.equal(torch.isinf(ours[row]), torch.isinf(ref)), req_id
        finite = ~torch.isinf(ref)
        torch.testing.assert_close(ours[row][finite], ref[finite], rtol=1e-6, atol=1e-6, msg=req_id)


_STATES: dict[str, CachedRequestState] = {}


def _random_logits(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_edits_match_transformers_and_follow_rows(vllm_config):
    batch = _batch(vllm_config)
    _STATES.clear()
    for req_id in REQUESTS:
        _STATES[req_id] = _state(req_id)
        batch.add_request(_STATES[req_id])
    batch.condense()
    batch.refresh_metadata()
    _check(batch, _random_logits(batch.num_reqs, 0))

    # Remove two rows: the last rows move into the holes (UNIDIRECTIONAL
    # moves); every request's edits must move with it.
    batch.remove_request("rep")
    batch.remove_request("allowed")
    batch.condense()
    batch.refresh_metadata()
    assert "rep" not in batch.req_ids and batch.num_reqs == len(REQUESTS) - 2
    _check(batch, _random_logits(batch.num_reqs, 1))

    # Swap two rows, add a request into a fresh row, and generate tokens: the
    # penalties count them, bad-word prefixes match them, min_tokens releases.
    batch.swap_states(0, batch.num_reqs - 1)
    _STATES["rep"] = _state("rep")
    batch.add_request(_STATES["rep"])
    for state, new in (
        (_STATES["min"], [7, 7, 7]),
        (_STATES["bad"], [99, 43]),
        (_STATES["freq"], [23]),
    ):
        state.output_token_ids.extend(new)  # the batch shares these lists
    batch.condense()
    batch.refresh_metadata()
    _check(batch, _random_logits(batch.num_reqs, 2))
    assert len(_STATES["min"].output_token_ids) >= 4  # released
    row = batch.req_id_to_index["min"]
    ours = Sampler().apply_logits_processors(
        _random_logits(batch.num_reqs, 3), batch.sampling_metadata
    )
    assert torch.isfinite(ours[row, [EOS, 7, 9]]).all()


def test_a_row_reused_by_a_plain_request_carries_nothing_over(vllm_config):
    batch = _batch(vllm_config)
    _STATES.clear()
    for req_id in ("allowed", "bias", "min"):
        _STATES[req_id] = _state(req_id)
        batch.add_request(_STATES[req_id])
    batch.condense()
    batch.refresh_metadata()
    for req_id in ("allowed", "bias", "min"):
        batch.remove_request(req_id)
    _STATES["plain"] = _state("plain")
    batch.add_request(_STATES["plain"])  # takes row 0, the allowed-token row
    batch.condense()
    batch.refresh_metadata()
    meta = batch.sampling_metadata
    assert meta.allowed_token_ids_mask is None and meta.no_penalties
    logits = _random_logits(1, 4)
    torch.testing.assert_close(Sampler().apply_logits_processors(logits.clone(), meta), logits)


def test_greedy_sampling_sees_the_edits(vllm_config):
    batch = _batch(vllm_config)
    _STATES.clear()
    for req_id in REQUESTS:
        _STATES[req_id] = _state(req_id)
        batch.add_request(_STATES[req_id])
    batch.condense()
    batch.refresh_metadata()
    logits = _random_logits(batch.num_reqs, 5)
    out = Sampler()(logits.clone(), batch.sampling_metadata)
    for row, req_id in enumerate(batch.req_ids):
        assert (
            out.sampled_token_ids[row, 0] == _reference_row(logits[row], _STATES[req_id]).argmax()
        )
    allowed_row = batch.req_id_to_index["allowed"]
    assert out.sampled_token_ids[allowed_row, 0] in (3, 30, 31, 400)


def test_penalty_token_padding_ignores_placeholders_and_foreign_ids():
    from vllm.v1.sample.ops.penalties import apply_all_penalties, make_padded_token_tensor

    padded = make_padded_token_tensor([[3, -1, 3], [], [V + 7, 2]], pad=V, device=CPU)
    assert padded.tolist() == [[3, V, 3], [V, V, V], [V, 2, V]]
    logits = torch.full((3, V), 2.0)
    prompt = torch.full((3, 1), V)  # no prompt tokens
    out = apply_all_penalties(
        logits.clone(),
        prompt,
        torch.tensor([0.5, 0.5, 0.5]),
        torch.tensor([1.0, 1.0, 1.0]),
        torch.tensor([2.0, 2.0, 2.0]),
        [[3, -1, 3], [], [V + 7, 2]],
    )
    # Row 0: token 3 twice -> 2 / 2 - 1 * 2 - 0.5; row 1 untouched; row 2: token 2 once.
    assert out[0, 3].item() == pytest.approx(1.0 - 2.0 - 0.5)
    assert out[2, 2].item() == pytest.approx(1.0 - 1.0 - 0.5)
    untouched = torch.ones(3, V, dtype=torch.bool)
    untouched[0, 3] = untouched[2, 2] = False
    assert torch.equal(out[untouched], logits[untouched])
