"""Per-request state of Model Runner V2 (upstream: vllm/v1/worker/gpu/states.py).

Each request owns one row of every tensor here, from `add_request` until
`remove_request` (finished or preempted), and never moves. The rows of a step's
batch are picked through `idx_mapping` (batch position -> row), so nothing is
reordered or condensed when requests come and go, unlike V1's persistent batch.

Lengths, for a request in row r:
- `prompt_len[r]`: tokens of the user's prompt;
- `prefill_len[r]`: tokens the runner was handed to prefill, >= prompt_len
  (a request resumed after preemption is prefilled with prompt + the tokens it
  had generated);
- `total_len[r]`: tokens known so far (prefill + sampled since); it grows on
  the device as tokens are sampled;
- `num_computed_tokens[r]`: tokens whose KV is in the cache.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm.v1.worker.gpu.buffer_utils import StagedWriteTensor
from vllm.v1.worker.utils import CpuGpuBuffer


class RequestState:
    """Rows of token ids, lengths and sampled tokens, one per live request."""

    def __init__(
        self,
        max_num_reqs: int,
        max_model_len: int,
        max_num_batched_tokens: int,
        num_speculative_steps: int,
        vocab_size: int,
        device: torch.device,
        pin_memory: bool = False,
    ) -> None:
        self.max_num_reqs = max_num_reqs
        self.max_model_len = max_model_len
        self.max_num_batched_tokens = max_num_batched_tokens
        self.num_speculative_steps = num_speculative_steps
        self.vocab_size = vocab_size
        self.device = device

        self.req_id_to_index: dict[str, int] = {}
        self.index_to_req_id: dict[int, str] = {}
        # pop() takes from the end: row 0 is handed out first.
        self.free_indices: list[int] = list(range(max_num_reqs - 1, -1, -1))

        # [max_num_reqs, max_model_len]: prefill tokens, then sampled tokens.
        self.all_token_ids = StagedWriteTensor((max_num_reqs, max_model_len), torch.int32, device)
        self.prompt_len = CpuGpuBuffer(
            max_num_reqs, dtype=torch.int32, device=device, pin_memory=pin_memory
        )
        self.prefill_len = CpuGpuBuffer(
            max_num_reqs, dtype=torch.int32, device=device, pin_memory=pin_memory
        )
        self.total_len = StagedWriteTensor(max_num_reqs, torch.int32, device)

        # Device truth plus a host mirror, kept exact by the scheduler's
        # num_computed_tokens each step (no device-to-host sync needed).
        self.num_computed_tokens = StagedWriteTensor(max_num_reqs, torch.int32, device)
        self.num_computed_tokens_np = np.zeros(max_num_reqs, dtype=np.int32)
        # Prefill tokens computed so far, capped at prefill_len (host only).
        self.num_computed_prefill_tokens = np.zeros(max_num_reqs, dtype=np.int32)

        # [max_num_reqs, 1]: the token each request sampled last; a decode
        # step reads its input token from here, on the device.
        self.last_sampled_tokens = torch.zeros(max_num_reqs, 1, dtype=torch.int64, device=device)
        # [max_num_reqs, num_speculative_steps]: draft tokens to verify next step.
        self.draft_tokens = torch.zeros(
            max_num_reqs, num_speculative_steps, dtype=torch.int64, device=device
        )

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(
        self, req_id: str, prompt_len: int, all_token_ids: list[int], num_computed_tokens: int
    ) -> int:
        """Give `req_id` a free row and stage its tokens; returns the row.

        `all_token_ids` is everything to prefill (prompt, plus the generated
        tokens of a resumed request); `num_computed_tokens` of them are already
        in the KV cache (prefix-cache hits).
        """
        if req_id in self.req_id_to_index:
            raise ValueError(f"Request {req_id!r} already has a row.")
        if not self.free_indices:
            raise RuntimeError(f"All {self.max_num_reqs} request rows are in use.")
        prefill_len = len(all_token_ids)
        if not prompt_len <= prefill_len <= self.max_model_len:
            raise ValueError(
                f"Request {req_id!r}: prefill length {prefill_len} must be in "
                f"[prompt_len {prompt_len}, max_model_len {self.max_model_len}]."
            )
        req_idx = self.free_indices.pop()
        self.req_id_to_index[req_id] = req_idx
        self.index_to_req_id[req_idx] = req_id

        self.prompt_len.np[req_idx] = prompt_len
        self.prefill_len.np[req_idx] = prefill_len
        self.all_token_ids.stage_write(req_idx, 0, all_token_ids)
        self.total_len.stage_write_elem(req_idx, prefill_len)
        self.num_computed_tokens.stage_write_elem(req_idx, num_computed_tokens)
        self.num_computed_tokens_np[req_idx] = num_computed_tokens
        self.num_computed_prefill_tokens[req_idx] = min(num_computed_tokens, prefill_len)
        return req_idx

    def remove_request(self, req_id: str) -> int | None:
        """Free the request's row; returns it (None for an unknown request)."""
        req_idx = self.req_id_to_index.pop(req_id, None)
        if req_idx is None:
            return None
        del self.index_to_req_id[req_idx]
        self.free_indices.append(req_idx)
        return req_idx

    def get_req_indices(self, req_ids: list[str]) -> np.ndarray:
        """[len(req_ids)] int64: the row of each request (KeyError if unknown)."""
        return np.fromiter(
            map(self.req_id_to_index.__getitem__, req_ids), dtype=np.int64, count=len(req_ids)
        )

    def set_num_computed_tokens(
        self, req_indices: np.ndarray, num_computed_tokens: np.ndarray
    ) -> None:
        """Take the scheduler's counts for requests already in their rows
        (one vectorised scatter instead of a staged write per request)."""
        if req_indices.size == 0:
            return
        self.num_computed_tokens_np[req_indices] = num_computed_tokens
        idx = torch.from_numpy(req_indices).to(self.device, non_blocking=True)
        values = torch.from_numpy(num_computed_tokens).to(self.device, non_blocking=True)
        self.num_computed_tokens.gpu.index_copy_(0, idx, values)

    def advance_host_counts(self, req_indices: np.ndarray, num_scheduled: np.ndarray) -> None:
        """After a step: the host mirrors of the computed-token counts advance
        by the tokens scheduled (prefill tokens capped at prefill_len)."""
        self.num_computed_tokens_np[req_indices] += num_scheduled
        computed_prefill = self.num_computed_prefill_tokens
        computed_prefill[req_indices] = np.minimum(
            computed_prefill[req_indices] + num_scheduled, self.prefill_len.np[req_indices]
        )

    def apply_staged_writes(self) -> None:
        """Publish every host-side change of this step to the device."""
        self.prompt_len.copy_to_gpu()
        self.prefill_len.copy_to_gpu()
        self.all_token_ids.apply_write()
        self.total_len.apply_write()
        self.num_computed_tokens.apply_write()
