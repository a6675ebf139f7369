"""The V1 runner's persistent batch (upstream: vllm/v1/worker/gpu_input_batch.py).

Requests keep a row in `InputBatch` across steps, so a decode step only
touches what changed (one token, maybe one block) instead of rebuilding the
batch. Rows [0, num_reqs) are the live batch in order; removing a request
leaves a hole that `add_request` refills or `condense()` closes by moving the
last rows into the holes. Everything per-row lives in numpy arrays (views of
CPU tensors) so the runner can prepare inputs with vectorised numpy.

Sampling state lives here too: per-row temperature / top-p / top-k / min-p and
penalties, an allowed-token mask, bad words, generators; logit bias and
min_tokens live in the logits processors, which learn about rows that come,
go and move through a `BatchUpdateBuilder` drained once per step by
`refresh_metadata`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from vllm.logger import init_logger
from vllm.sampling_params import SamplingParams, SamplingType
from vllm.v1.sample.logits_processor import (
    BatchUpdate,
    BatchUpdateBuilder,
    LogitsProcessors,
    MoveDirectionality,
)
from vllm.v1.sample.metadata import SamplingMetadata
from vllm.v1.worker.block_table import MultiGroupBlockTable
from vllm.v1.worker.utils import CpuGpuBuffer

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest
    from vllm.pooling_params import PoolingParams

logger = init_logger(__name__)

# Temperature stored for greedy rows: below the sampling epsilon, so the
# sampler's `temperature < eps` test picks argmax for them.
_GREEDY_TEMPERATURE = -1.0


_V = TypeVar("_V")


def _swap_keys(row_dict: dict[int, _V], i1: int, i2: int) -> None:
    """Swap the entries of rows i1 and i2 in a row-keyed dict (either may be absent)."""
    v1, v2 = row_dict.pop(i1, None), row_dict.pop(i2, None)
    if v1 is not None:
        row_dict[i2] = v1
    if v2 is not None:
        row_dict[i1] = v2


def _move_key(row_dict: dict[int, _V], src: int, dst: int) -> None:
    value = row_dict.pop(src, None)
    if value is not None:
        row_dict[dst] = value


@dataclass
class CachedRequestState:
    """What the runner remembers about a request between steps, including
    while it is preempted and out of the batch."""

    req_id: str
    prompt_token_ids: list[int]
    mm_features: list[Any]
    sampling_params: SamplingParams | None
    generator: torch.Generator | None
    # One list of block ids per KV cache group.
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    # Shared with `InputBatch.req_output_token_ids`: appending here is seen there.
    output_token_ids: list[int]
    lora_request: LoRARequest | None = None
    # Pooling requests (runner="pooling") carry these instead of sampling params.
    pooling_params: PoolingParams | None = None
    num_prompt_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)

    def get_token_id(self, idx: int) -> int:
        if idx < self.num_prompt_tokens:
            return self.prompt_token_ids[idx]
        return self.output_token_ids[idx - self.num_prompt_tokens]


class InputBatch:
    """Rows of token ids, progress, block tables and sampling parameters."""

    def __init__(
        self,
        max_num_reqs: int,
        max_model_len: int,
        max_num_batched_tokens: int,
        device: torch.device,
        pin_memory: bool,
        vocab_size: int,
        block_sizes: list[int],
        logitsprocs: LogitsProcessors | None = None,
    ) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        self.device = device
        self.pin_memory = pin_memory
        self.vocab_size = vocab_size

        self._req_ids: list[str | None] = []
        self.req_id_to_index: dict[str, int] = {}
        # Holes left by remove_request, refilled by add_request / condense.
        self._removed_indices: set[int] = set()

        # [max_num_reqs, max_model_len]: prompt then output token ids per row.
        self.token_ids_cpu_tensor = torch.zeros(
            (max_num_reqs, max_model_len), dtype=torch.int32, device="cpu"
        )
        self.token_ids_cpu = self.token_ids_cpu_tensor.numpy()
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens_cpu_tensor = torch.zeros(max_num_reqs, dtype=torch.int32)
        self.num_computed_tokens_cpu = self.num_computed_tokens_cpu_tensor.numpy()

        self.block_table = MultiGroupBlockTable(
            max_num_reqs, max_model_len, max_num_batched_tokens, pin_memory, device, block_sizes
        )

        def buffer(dtype: torch.dtype) -> CpuGpuBuffer:
            return CpuGpuBuffer(max_num_reqs, dtype=dtype, device=device, pin_memory=pin_memory)

        self.temperature = buffer(torch.float32)
        self.top_p = buffer(torch.float32)
        self.top_k = buffer(torch.int32)
        self.min_p = buffer(torch.float32)
        self.frequency_penalties = buffer(torch.float32)
        self.presence_penalties = buffer(torch.float32)
        self.repetition_penalties = buffer(torch.float32)
        # req ids per sampling feature; a feature's tensor is sent only when
        # its set is non-empty.
        self.greedy_reqs: set[str] = set()
        self.random_reqs: set[str] = set()
        self.top_p_reqs: set[str] = set()
        self.top_k_reqs: set[str] = set()
        self.min_p_reqs: set[str] = set()
        self.frequency_penalties_reqs: set[str] = set()
        self.presence_penalties_reqs: set[str] = set()
        self.repetition_penalties_reqs: set[str] = set()
        # [max_num_reqs, vocab] bool, True = not allowed. Allocated on first
        # use (it is large); rows of requests without allowed_token_ids are False.
        self.allowed_token_ids_mask_cpu_tensor: torch.Tensor | None = None
        self.has_allowed_token_ids: set[str] = set()
        # row -> bad words (token-id sequences) of the request in that row
        self.bad_words_token_ids: dict[int, list[list[int]]] = {}
        # row -> generator of a seeded request
        self.generators: dict[int, torch.Generator] = {}
        # req_id -> number of logprobs asked for
        self.num_logprobs: dict[str, int] = {}
        # row -> the request's output token list (the CachedRequestState's)
        self.req_output_token_ids: list[list[int] | None] = []
        # LoRA: row -> the request's lora_int_id (0 = base model), and the
        # adapters of the rows (make_lora_inputs builds the step's mapping).
        self.request_lora_mapping = np.zeros(max_num_reqs, dtype=np.int64)
        self.lora_id_to_request_ids: dict[int, set[str]] = {}
        self.lora_id_to_lora_request: dict[int, LoRARequest] = {}

        self.logitsprocs = logitsprocs if logitsprocs is not None else LogitsProcessors()
        self.batch_update_builder = BatchUpdateBuilder()
        # [num_reqs, max_prompt_len] for the penalties; rebuilt when rows change.
        self._prompt_token_ids_tensor: torch.Tensor | None = None
        self.sampling_metadata = self._make_sampling_metadata()

    # ---- queries -------------------------------------------------------------
    @property
    def req_ids(self) -> list[str]:
        """Request ids of rows [0, num_reqs); valid after `condense()`."""
        return self._req_ids  # type: ignore[return-value]

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    @property
    def num_tokens_no_spec(self) -> np.ndarray:
        """[max_num_reqs] tokens known per row, without draft tokens (upstream's
        name; `num_tokens` never counts the drafts written after them)."""
        return self.num_tokens

    @property
    def all_greedy(self) -> bool:
        return not self.random_reqs

    @property
    def all_random(self) -> bool:
        return not self.greedy_reqs

    @property
    def no_top_p(self) -> bool:
        return not self.top_p_reqs

    @property
    def no_top_k(self) -> bool:
        return not self.top_k_reqs

    @property
    def no_min_p(self) -> bool:
        return not self.min_p_reqs

    @property
    def no_penalties(self) -> bool:
        return not (
            self.frequency_penalties_reqs
            or self.presence_penalties_reqs
            or self.repetition_penalties_reqs
        )

    @property
    def no_allowed_token_ids(self) -> bool:
        return not self.has_allowed_token_ids

    @property
    def max_num_logprobs(self) -> int | None:
        if not self.num_logprobs:
            return None
        values = self.num_logprobs.values()
        return -1 if -1 in values else max(values)

    # ---- adding and removing rows -------------------------------------------
    def add_request(self, request: CachedRequestState) -> int:
        """Put `request` in the lowest free row; returns that row."""
        req_id = request.req_id
        assert req_id not in self.req_id_to_index, f"{req_id} is already in the batch"
        if self._removed_indices:
            row = min(self._removed_indices)
            self._removed_indices.remove(row)
            self.batch_update_builder.reuse_removed(row)
            self._req_ids[row] = req_id
            self.req_output_token_ids[row] = request.output_token_ids
        else:
            row = len(self._req_ids)
            if row >= self.max_num_reqs:
                raise ValueError(f"The batch holds at most {self.max_num_reqs} requests.")
            self._req_ids.append(req_id)
            self.req_output_token_ids.append(request.output_token_ids)
        self.req_id_to_index[req_id] = row

        num_prompt = request.num_prompt_tokens
        num_tokens = request.num_tokens
        if num_tokens > self.max_model_len:
            raise ValueError(
                f"Request {req_id} has {num_tokens} tokens, more than "
                f"max_model_len={self.max_model_len}."
            )
        self.token_ids_cpu[row, :num_prompt] = request.prompt_token_ids
        self.token_ids_cpu[row, num_prompt:num_tokens] = request.output_token_ids
        self.num_prompt_tokens[row] = num_prompt
        self.num_tokens[row] = num_tokens
        self.num_computed_tokens_cpu[row] = request.num_computed_tokens
        self.block_table.add_row(request.block_ids, row)
        self._add_lora(req_id, row, request.lora_request)

        params = request.sampling_params
        if params is not None:
            self._add_sampling_params(req_id, row, params, request.generator)
            self.batch_update_builder.add(
                (row, params, request.prompt_token_ids, request.output_token_ids)
            )
        return row

    def _add_lora(self, req_id: str, row: int, lora_request: LoRARequest | None) -> None:
        if lora_request is None:
            self.request_lora_mapping[row] = 0
            return
        lora_id = lora_request.lora_int_id
        self.request_lora_mapping[row] = lora_id
        self.lora_id_to_request_ids.setdefault(lora_id, set()).add(req_id)
        self.lora_id_to_lora_request[lora_id] = lora_request

    def _remove_lora(self, req_id: str, row: int) -> None:
        lora_id = int(self.request_lora_mapping[row])
        self.request_lora_mapping[row] = 0
        if lora_id == 0:
            return
        req_ids = self.lora_id_to_request_ids[lora_id]
        req_ids.discard(req_id)
        if not req_ids:  # the adapter's last request in the batch
            del self.lora_id_to_request_ids[lora_id]
            del self.lora_id_to_lora_request[lora_id]

    def make_lora_inputs(
        self, num_scheduled_tokens: np.ndarray, num_sampled_tokens: np.ndarray
    ) -> tuple[tuple[int, ...], tuple[int, ...], list[LoRARequest]]:
        """(prompt_lora_mapping: the LoRA id of each sampled row,
        token_lora_mapping: the LoRA id of each scheduled token, the adapters
        of the batch, one per id), rows [0, num_reqs) in order; both arrays
        are per row. Not a set: LoRARequests compare by name, and a name
        reloaded under a new id may run next to its old load."""
        ids = self.request_lora_mapping[: self.num_reqs]
        prompt_mapping = tuple(ids.repeat(num_sampled_tokens).tolist())
        token_mapping = tuple(ids.repeat(num_scheduled_tokens).tolist())
        return prompt_mapping, token_mapping, list(self.lora_id_to_lora_request.values())

    def _add_sampling_params(
        self, req_id: str, row: int, params: SamplingParams, generator: torch.Generator | None
    ) -> None:
        if params.sampling_type == SamplingType.GREEDY:
            self.temperature.np[row] = _GREEDY_TEMPERATURE
            self.greedy_reqs.add(req_id)
        else:
            self.temperature.np[row] = params.temperature
            self.random_reqs.add(req_id)
        self.top_p.np[row] = params.top_p
        if params.top_p < 1.0:
            self.top_p_reqs.add(req_id)
        # 0 and -1 both mean "no top-k"; k >= vocab is the same as none.
        top_k = params.top_k if 0 < params.top_k < self.vocab_size else self.vocab_size
        self.top_k.np[row] = top_k
        if top_k < self.vocab_size:
            self.top_k_reqs.add(req_id)
        self.min_p.np[row] = params.min_p
        if params.min_p > 1e-5:
            self.min_p_reqs.add(req_id)
        if generator is not None:
            self.generators[row] = generator
        if params.logprobs is not None:
            self.num_logprobs[req_id] = params.logprobs
        self._add_penalties(req_id, row, params)
        if params.allowed_token_ids:
            self._set_allowed_token_ids(req_id, row, params.allowed_token_ids)
        if params.bad_words_token_ids:
            self.bad_words_token_ids[row] = params.bad_words_token_ids

    def _add_penalties(self, req_id: str, row: int, params: SamplingParams) -> None:
        self.frequency_penalties.np[row] = params.frequency_penalty
        self.presence_penalties.np[row] = params.presence_penalty
        self.repetition_penalties.np[row] = params.repetition_penalty
        if params.frequency_penalty != 0.0:
            self.frequency_penalties_reqs.add(req_id)
        if params.presence_penalty != 0.0:
            self.presence_penalties_reqs.add(req_id)
        if params.repetition_penalty != 1.0:
            self.repetition_penalties_reqs.add(req_id)

    def _set_allowed_token_ids(self, req_id: str, row: int, allowed: list[int]) -> None:
        if self.allowed_token_ids_mask_cpu_tensor is None:
            self.allowed_token_ids_mask_cpu_tensor = torch.zeros(
                (self.max_num_reqs, self.vocab_size), dtype=torch.bool, device="cpu"
            )
        mask = self.allowed_token_ids_mask_cpu_tensor
        mask[row] = True
        ids = [t for t in allowed if 0 <= t < self.vocab_size]
        mask[row, ids] = False
        self.has_allowed_token_ids.add(req_id)

    def remove_request(self, req_id: str) -> int | None:
        """Drop `req_id` from the batch, leaving a hole; returns its old row."""
        row = self.req_id_to_index.pop(req_id, None)
        if row is None:
            return None
        self._removed_indices.add(row)
        self._remove_lora(req_id, row)
        self.batch_update_builder.removed_append(row)
        self._req_ids[row] = None
        self.req_output_token_ids[row] = None
        for feature_set in (
            self.greedy_reqs,
            self.random_reqs,
            self.top_p_reqs,
            self.top_k_reqs,
            self.min_p_reqs,
            self.frequency_penalties_reqs,
            self.presence_penalties_reqs,
            self.repetition_penalties_reqs,
        ):
            feature_set.discard(req_id)
        if req_id in self.has_allowed_token_ids:
            self.has_allowed_token_ids.discard(req_id)
            # The next request in this row must not inherit the mask (which
            # exists since a request with allowed token ids was added).
            assert self.allowed_token_ids_mask_cpu_tensor is not None
            self.allowed_token_ids_mask_cpu_tensor[row] = False
        self.bad_words_token_ids.pop(row, None)
        self.generators.pop(row, None)
        self.num_logprobs.pop(req_id, None)
        return row

    # ---- moving rows ---------------------------------------------------------
    def swap_states(self, i1: int, i2: int) -> None:
        """Exchange rows i1 and i2 (both live)."""
        id1, id2 = self._req_ids[i1], self._req_ids[i2]
        assert id1 is not None and id2 is not None
        self._req_ids[i1], self._req_ids[i2] = id2, id1
        outs = self.req_output_token_ids
        outs[i1], outs[i2] = outs[i2], outs[i1]
        self.req_id_to_index[id1], self.req_id_to_index[id2] = i2, i1

        pair, rev = [i1, i2], [i2, i1]
        width = int(max(self.num_tokens[i1], self.num_tokens[i2]))
        self.token_ids_cpu[pair, :width] = self.token_ids_cpu[rev, :width]
        for arr in self._row_arrays():
            arr[pair] = arr[rev]
        self.block_table.swap_row(i1, i2)

        _swap_keys(self.generators, i1, i2)
        _swap_keys(self.bad_words_token_ids, i1, i2)
        self.batch_update_builder.move(i1, i2, MoveDirectionality.SWAP)

    def _move_row(self, src: int, dst: int) -> None:
        """Move live row `src` into the hole `dst`."""
        req_id = self._req_ids[src]
        assert req_id is not None and self._req_ids[dst] is None
        self._req_ids[dst], self._req_ids[src] = req_id, None
        outs = self.req_output_token_ids
        outs[dst], outs[src] = outs[src], None
        self.req_id_to_index[req_id] = dst

        num_tokens = self.num_tokens[src]
        self.token_ids_cpu[dst, :num_tokens] = self.token_ids_cpu[src, :num_tokens]
        for arr in self._row_arrays():
            arr[dst] = arr[src]
        self.block_table.move_row(src, dst)
        if self.allowed_token_ids_mask_cpu_tensor is not None:
            self.allowed_token_ids_mask_cpu_tensor[src] = False  # src is a hole now
        _move_key(self.generators, src, dst)
        _move_key(self.bad_words_token_ids, src, dst)
        self.batch_update_builder.move(src, dst, MoveDirectionality.UNIDIRECTIONAL)

    def _row_arrays(self) -> tuple[np.ndarray, ...]:
        arrays: tuple[np.ndarray, ...] = (
            self.num_tokens,
            self.num_prompt_tokens,
            self.num_computed_tokens_cpu,
            self.temperature.np,
            self.top_p.np,
            self.top_k.np,
            self.min_p.np,
            self.frequency_penalties.np,
            self.presence_penalties.np,
            self.repetition_penalties.np,
            self.request_lora_mapping,
        )
        if self.allowed_token_ids_mask_cpu_tensor is not None:
            arrays += (self.allowed_token_ids_mask_cpu_tensor.numpy(),)
        return arrays

    def condense(self) -> None:
        """Close the holes: move the last live rows into the lowest holes so
        that rows [0, num_reqs) are exactly the live requests."""
        num_reqs = self.num_reqs
        if self._removed_indices:
            last = len(self._req_ids) - 1
            for hole in sorted(self._removed_indices):
                while last >= 0 and self._req_ids[last] is None:
                    last -= 1
                if hole >= last:
                    break
                self._move_row(last, hole)
                last -= 1
            self._removed_indices.clear()
        del self._req_ids[num_reqs:]
        del self.req_output_token_ids[num_reqs:]

    # ---- sampled tokens --------------------------------------------------------
    def append_sampled_tokens(self, token_ids: np.ndarray, discard_mask: np.ndarray) -> np.ndarray:
        """Append token_ids[row] ([num_reqs]) to every row not in `discard_mask`
        (rows still mid-prefill), in the token table and the request's output
        list; returns those rows. With async scheduling the ids are placeholders
        (vllm/v1/worker/async_sampled_tokens.py)."""
        rows = np.flatnonzero(~discard_mask)
        # Write the new tokens after each row's last token, all rows at once.
        cols = self.num_tokens[rows]
        fits = cols < self.max_model_len
        self.token_ids_cpu[rows[fits], cols[fits]] = token_ids[rows[fits]]
        self.num_tokens[rows] += 1
        values = token_ids.tolist()
        for row in rows.tolist():
            output_ids = self.req_output_token_ids[row]
            assert output_ids is not None, f"row {row} is a hole"
            output_ids.append(values[row])
        return rows

    # ---- sampling metadata ---------------------------------------------------
    def sampling_metadata_for_step(self, discard_mask: np.ndarray) -> SamplingMetadata:
        """`sampling_metadata` minus the generators of rows still mid-prefill:
        their draw is discarded, so it must not advance their generator
        (seeded output must not depend on chunking)."""
        metadata = self.sampling_metadata
        generators = metadata.generators
        if generators and discard_mask.any():
            kept = {row: g for row, g in generators.items() if not discard_mask[row]}
            metadata = dataclasses.replace(metadata, generators=kept)
        return metadata

    def refresh_metadata(self) -> None:
        """Hand this step's row changes to the logits processors and rebuild
        `sampling_metadata` for the current rows (after condense)."""
        batch_update: BatchUpdate | None = self.batch_update_builder.get_and_reset(self.num_reqs)
        # Processors are updated every step: per-request state such as the
        # number of generated tokens (min_tokens) changes without row changes.
        for processor in self.logitsprocs.all:
            processor.update_state(batch_update)
        if batch_update is not None:
            self._prompt_token_ids_tensor = None
        self.sampling_metadata = self._make_sampling_metadata()

    def _make_sampling_metadata(self) -> SamplingMetadata:
        n = self.num_reqs
        all_greedy = self.all_greedy
        no_penalties = self.no_penalties
        prompt_token_ids = None
        if not no_penalties:
            if self._prompt_token_ids_tensor is None:
                self._prompt_token_ids_tensor = self._make_prompt_token_ids_tensor()
            prompt_token_ids = self._prompt_token_ids_tensor
        allowed_mask = None
        if not self.no_allowed_token_ids:
            assert self.allowed_token_ids_mask_cpu_tensor is not None
            allowed_mask = self.allowed_token_ids_mask_cpu_tensor[:n].to(
                self.device, non_blocking=True
            )
        return SamplingMetadata(
            temperature=None if all_greedy else self.temperature.copy_to_gpu(n),
            all_greedy=all_greedy,
            all_random=self.all_random,
            top_p=None if self.no_top_p else self.top_p.copy_to_gpu(n),
            top_k=None if self.no_top_k else self.top_k.copy_to_gpu(n),
            min_p=None if self.no_min_p else self.min_p.copy_to_gpu(n),
            generators=self.generators,
            max_num_logprobs=self.max_num_logprobs,
            no_penalties=no_penalties,
            prompt_token_ids=prompt_token_ids,
            frequency_penalties=None if no_penalties else self.frequency_penalties.copy_to_gpu(n),
            presence_penalties=None if no_penalties else self.presence_penalties.copy_to_gpu(n),
            repetition_penalties=(
                None if no_penalties else self.repetition_penalties.copy_to_gpu(n)
            ),
            output_token_ids=self.req_output_token_ids,  # type: ignore[arg-type]
            allowed_token_ids_mask=allowed_mask,
            bad_words_token_ids=self.bad_words_token_ids,
            logitsprocs=self.logitsprocs,
        )

    def _make_prompt_token_ids_tensor(self) -> torch.Tensor:
        """[num_reqs, max_prompt_len] int64 prompt ids, padded with vocab_size
        (an id no token has, which the penalty counts drop)."""
        n = self.num_reqs
        num_prompt = self.num_prompt_tokens[:n]
        max_len = int(num_prompt.max()) if n else 0
        ids = self.token_ids_cpu[:n, :max_len].astype(np.int64)
        ids[np.arange(max_len)[None, :] >= num_prompt[:, None]] = self.vocab_size
        return torch.from_numpy(ids).to(self.device, non_blocking=True)
