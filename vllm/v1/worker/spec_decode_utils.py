"""Speculative decoding in the V1 model runner (upstream keeps this inside
vllm/v1/worker/gpu_model_runner.py; split out so the runner's methods stay
short).

One step with a drafter (under async scheduling the scheduled drafts are
placeholders, replaced by the runner's own: vllm/v1/worker/async_spec_decode.py):
  _update_states    write_draft_tokens: the scheduled drafts go into
                    token_ids_cpu after each row's known tokens
  _prepare_inputs   SpeculativeDecoder.step_inputs: SpecDecodeMetadata
                    (calc_spec_decode_metadata) when any row has drafts
  forward           logits for metadata.logits_indices
  sample_tokens     SpeculativeDecoder.verify (RejectionSampler, then a
                    variable number of tokens appended per row), or the
                    plain Sampler when no row had drafts; then
                    SpeculativeDecoder.propose for the next step

`build_drafter` picks the drafter for the configured method; the drafter
classes are imported lazily so a runner without speculation imports none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import torch

from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
from vllm.v1.spec_decode.proposer_inputs import ProposerInputs

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.utils import AttentionGroup


def build_drafter(vllm_config: VllmConfig, device: torch.device, runner: Any) -> Any | None:
    """The drafter for `vllm_config.speculative_config` (None without one):
    NgramProposer for "ngram", DraftModelProposer for "draft_model",
    EagleProposer for "eagle"/"eagle3", SuffixDecodingProposer for "suffix"."""
    spec = vllm_config.speculative_config
    if spec is None:
        return None
    method = spec.method
    if method == "ngram":
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer, NgramVllmConfigLike

        # VllmConfig.model_config is Optional; a runner always has one.
        return NgramProposer(cast(NgramVllmConfigLike, vllm_config))
    if method == "draft_model":
        from vllm.v1.spec_decode.draft_model import DraftModelProposer

        return DraftModelProposer(vllm_config, device, runner)
    if method in ("eagle", "eagle3"):
        from vllm.v1.spec_decode.eagle import EagleProposer

        return EagleProposer(vllm_config, device, runner)
    if method == "suffix":
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer

        return SuffixDecodingProposer(vllm_config)
    raise NotImplementedError(
        f"Speculative decoding method {method!r} is not supported by the V1 model runner."
    )


def write_draft_tokens(batch: InputBatch, spec_tokens: dict[str, list[int]]) -> None:
    """Put each scheduled request's drafts after its known tokens in
    `token_ids_cpu` (columns num_tokens_no_spec .. + k), where the step's
    input ids are read from. `num_tokens_no_spec` does not count them."""
    for req_id, drafts in spec_tokens.items():
        row = batch.req_id_to_index.get(req_id)
        if row is None or not drafts:
            continue
        start = int(batch.num_tokens_no_spec[row])
        end = min(start + len(drafts), batch.max_model_len)
        batch.token_ids_cpu[row, start:end] = drafts[: end - start]


def num_draft_tokens_per_row(batch: InputBatch, spec_tokens: dict[str, list[int]]) -> np.ndarray:
    """[num_reqs] int32: drafts scheduled for each batch row (0 for most)."""
    counts = np.zeros(batch.num_reqs, dtype=np.int32)
    for req_id, drafts in spec_tokens.items():
        row = batch.req_id_to_index.get(req_id)
        if row is not None:
            counts[row] = len(drafts)
    return counts


def calc_spec_decode_metadata(
    num_draft_tokens: np.ndarray,
    cu_num_scheduled_tokens: np.ndarray,
    input_ids: np.ndarray,
    device: torch.device,
) -> SpecDecodeMetadata:
    """Upstream's `_calc_spec_decode_metadata`. A request with n drafts gets
    logits for its last n + 1 scheduled tokens: its n draft rows, then its
    bonus row; a request without drafts one row (its last token).

    Example: drafts [3, 0, 2], scheduled [4, 10, 3], cu_num_scheduled [4, 14, 17]:
        logits_indices        = [0, 1, 2, 3, 13, 14, 15, 16]
        target_logits_indices = [0, 1, 2, 5, 6]   (rows of the draft positions)
        bonus_logits_indices  = [3, 4, 7]
        draft_token_ids       = input_ids[[1, 2, 3, 15, 16]]
    (`input_ids`: the step's flattened input ids, drafts included.)
    """
    num_sampled = num_draft_tokens + 1
    cu_num_sampled = np.cumsum(num_sampled, dtype=np.int32)
    # 0..n_i for each request i: the offset of each logits row in its request.
    offsets = np.arange(int(cu_num_sampled[-1]), dtype=np.int32) - np.repeat(
        cu_num_sampled - num_sampled, num_sampled
    )
    logits_indices = np.repeat(cu_num_scheduled_tokens - num_sampled, num_sampled) + offsets
    bonus_logits_indices = cu_num_sampled - 1
    # The logits rows of the draft positions: each request's first n rows.
    is_draft_row = offsets < np.repeat(num_draft_tokens, num_sampled)
    target_logits_indices = np.flatnonzero(is_draft_row).astype(np.int32)
    # The draft scored by logits row r is the input token at the next position.
    draft_token_ids = input_ids[logits_indices[target_logits_indices] + 1]

    def to_device(a: np.ndarray, dtype: torch.dtype = torch.int32) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device=device, dtype=dtype)

    return SpecDecodeMetadata(
        draft_token_ids=to_device(draft_token_ids),
        num_draft_tokens=num_draft_tokens.tolist(),
        cu_num_draft_tokens=to_device(np.cumsum(num_draft_tokens, dtype=np.int32)),
        cu_num_sampled_tokens=to_device(cu_num_sampled),
        target_logits_indices=to_device(target_logits_indices),
        bonus_logits_indices=to_device(bonus_logits_indices),
        logits_indices=to_device(logits_indices, torch.int64),
    )


def append_token_lists(
    batch: InputBatch, token_lists: list[list[int]], discard_mask: np.ndarray
) -> None:
    """Append each row's emitted tokens (a variable number: accepted drafts +
    the recovered or bonus token) to the persistent batch; rows in
    `discard_mask` (mid-prefill) and empty lists append nothing."""
    for row, tokens in enumerate(token_lists):
        if not tokens or discard_mask[row]:
            continue
        start = int(batch.num_tokens[row])
        end = min(start + len(tokens), batch.max_model_len)
        batch.token_ids_cpu[row, start:end] = tokens[: end - start]
        batch.num_tokens[row] += len(tokens)
        output_ids = batch.req_output_token_ids[row]
        assert output_ids is not None, f"row {row} is a hole"
        output_ids.extend(tokens)


def num_valid_tokens(
    num_scheduled: np.ndarray, num_draft_tokens: np.ndarray, sampled: list[list[int]]
) -> np.ndarray:
    """[num_reqs] int32: tokens of this step now known to be real. A row that
    emitted tokens ran its real tokens (num_scheduled - drafts) plus drafts of
    which len(emitted) - 1 were accepted; a mid-prefill row (nothing emitted)
    ran only real tokens. For a decode row this is len(emitted)."""
    num_emitted = np.fromiter((len(s) for s in sampled), dtype=np.int32, count=len(sampled))
    accepted = np.maximum(num_emitted - 1, 0)
    return np.where(
        num_emitted > 0, num_scheduled - num_draft_tokens + accepted, num_scheduled
    ).astype(np.int32)


def needs_draft(batch: InputBatch, sampled: list[list[int]]) -> np.ndarray:
    """[num_reqs] bool: the row emitted a token and still has room to grow."""
    emitted = np.fromiter((bool(s) for s in sampled), dtype=bool, count=len(sampled))
    return emitted & (batch.num_tokens_no_spec[: len(sampled)] < batch.max_model_len)


class SpecStep(NamedTuple):
    """A step's speculative-decoding facts, kept from `_prepare_inputs` to
    `sample_tokens` (runners with a drafter only)."""

    # None when no request of the step has drafts (the plain Sampler runs).
    metadata: SpecDecodeMetadata | None
    num_computed_tokens: np.ndarray  # [num_reqs] int32, before the step
    num_scheduled_tokens: np.ndarray  # [num_reqs] int32, drafts included
    num_draft_tokens: np.ndarray  # [num_reqs] int32


def split_model_output(output: Any, num_tokens: int) -> tuple[Any, list[torch.Tensor] | None]:
    """A forward's output as (hidden states, EAGLE3 auxiliary hidden states or
    None), the auxiliary ones cut to the step's `num_tokens` (no padding).
    With EAGLE3 the target returns a tuple (last hidden states, list of its
    chosen layers' outputs); else a tensor or IntermediateTensors."""
    if not isinstance(output, tuple):
        return output, None
    hidden_states, aux = output
    return hidden_states, [a[:num_tokens] for a in aux]


class SpeculativeDecoder:
    """The V1 runner's speculative-decoding part: the drafter, the rejection
    sampler, and the drafts proposed by the last step until the engine takes
    them (`take_draft_token_ids`)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device, runner: Any) -> None:
        spec = vllm_config.speculative_config
        assert spec is not None and spec.method is not None
        self.method: str = spec.method
        self.num_spec_tokens: int = spec.num_speculative_tokens or 0
        self.device = device
        drafter = build_drafter(vllm_config, device, runner)
        assert drafter is not None
        # NgramProposer, DraftModelProposer or EagleProposer (duck-typed).
        self.drafter: Any = drafter
        self.rejection_sampler = RejectionSampler(runner.sampler, spec, device)
        self._draft_token_ids: DraftTokenIds | None = None

    def step_inputs(
        self,
        batch: InputBatch,
        spec_tokens: dict[str, list[int]],
        num_scheduled: np.ndarray,
        cu_num_scheduled: np.ndarray,
        input_ids: np.ndarray,
    ) -> SpecStep:
        """The step's SpecStep (its metadata None when no row has drafts)."""
        num_drafts = num_draft_tokens_per_row(batch, spec_tokens)
        metadata = None
        if num_drafts.any():
            metadata = calc_spec_decode_metadata(
                num_drafts, cu_num_scheduled, input_ids, self.device
            )
        num_computed = batch.num_computed_tokens_cpu[: batch.num_reqs].copy()
        return SpecStep(metadata, num_computed, num_scheduled.copy(), num_drafts)

    def verify(
        self,
        batch: InputBatch,
        metadata: SpecDecodeMetadata,
        logits: torch.Tensor,
        discard_mask: np.ndarray,
    ) -> ModelRunnerOutput:
        """Verify the step's drafts (logits: per request its draft rows, then
        its bonus row) and append each request's emitted tokens (accepted
        drafts, then the recovered or bonus token) to the batch. Logprobs: one
        row per emitted token, `cu_num_generated_tokens` marking each request's."""
        sampler_output = self.rejection_sampler(
            metadata,
            None,  # no draft probabilities: ngram drafts and greedy model drafts
            logits,
            batch.sampling_metadata_for_step(discard_mask),
        )
        sampled, logprobs = RejectionSampler.parse_output(
            sampler_output.sampled_token_ids,
            batch.vocab_size,
            np.flatnonzero(discard_mask).tolist(),
            sampler_output.logprobs_tensors,
        )
        append_token_lists(batch, sampled, discard_mask)
        return ModelRunnerOutput(
            req_ids=list(batch.req_ids),
            req_id_to_index=dict(batch.req_id_to_index),
            sampled_token_ids=sampled,
            logprobs=logprobs,
        )

    def propose(
        self,
        batch: InputBatch,
        step: SpecStep,
        sampled: list[list[int]],
        hidden_states: torch.Tensor,
        aux_hidden_states: list[torch.Tensor] | None,
        attn_groups: list[list[AttentionGroup]],
    ) -> None:
        """The next step's drafts, one list per batch row ([] = none), once
        the step's tokens are in the batch. ngram: prompt lookup over the
        whole batch in one vectorised pass; model drafters:
        `drafter.propose(ProposerInputs)`."""
        num_reqs = batch.num_reqs
        if self.method == "ngram":
            drafts: list[list[int]] = self.drafter.propose(
                self.num_spec_tokens,
                sampled,
                batch.num_tokens_no_spec[:num_reqs],
                batch.token_ids_cpu,
            )
        elif self.method == "suffix":
            # Per-request suffix trees: a draft of 0..k tokens per row.
            drafts = self.drafter.propose(self.num_spec_tokens, batch, sampled)
        else:
            inputs = ProposerInputs(
                input_batch=batch,
                req_ids=list(batch.req_ids),
                num_computed_tokens=step.num_computed_tokens,
                num_scheduled_tokens=step.num_scheduled_tokens,
                num_valid_tokens=num_valid_tokens(
                    step.num_scheduled_tokens, step.num_draft_tokens, sampled
                ),
                needs_draft=needs_draft(batch, sampled),
                hidden_states=hidden_states,
                aux_hidden_states=aux_hidden_states,
                num_speculative_tokens=self.num_spec_tokens,
                attn_groups=attn_groups,
            )
            drafts = self.drafter.propose(inputs)
        self._draft_token_ids = DraftTokenIds(list(batch.req_ids), drafts)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts the last step proposed (once)."""
        drafts, self._draft_token_ids = self._draft_token_ids, None
        return drafts
