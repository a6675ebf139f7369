"""LoRA state of Model Runner V2 (upstream: vllm/v1/worker/gpu/lora_utils.py).

`LoraState` keeps each request row's adapter id (0 = base model) and the
request's `LoRARequest`, from `add_request` until the row is freed. A step's
mapping is built in the step's batch order through `idx_mapping` (batch
position -> row), like every other V2 input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest

NO_LORA_ID = 0


class LoraState:
    def __init__(self, max_num_reqs: int) -> None:
        # [max_num_reqs] row -> lora_int_id of the request in that row.
        self.lora_ids = np.full(max_num_reqs, NO_LORA_ID, dtype=np.int64)
        # req_id -> its adapter (requests without one are absent).
        self.lora_requests: dict[str, LoRARequest] = {}

    def add_request(self, req_id: str, req_index: int, lora_request: LoRARequest | None) -> None:
        if lora_request is None:
            self.lora_ids[req_index] = NO_LORA_ID
            return
        self.lora_requests[req_id] = lora_request
        self.lora_ids[req_index] = lora_request.lora_int_id

    def remove_request(self, req_id: str) -> None:
        # The row's id is overwritten when the row is handed out again.
        self.lora_requests.pop(req_id, None)

    def make_lora_inputs(
        self, req_ids: list[str], idx_mapping: np.ndarray, num_scheduled_tokens: np.ndarray
    ) -> tuple[tuple[int, ...], tuple[int, ...], list[LoRARequest]]:
        """(prompt_lora_mapping: one id per batch position (one logits row
        each: no drafts), token_lora_mapping: one id per scheduled token, the
        step's adapters); `idx_mapping` and `num_scheduled_tokens` are in
        batch order."""
        lora_ids = self.lora_ids[idx_mapping]
        prompt_mapping = tuple(lora_ids.tolist())
        token_mapping = tuple(lora_ids.repeat(num_scheduled_tokens).tolist())
        return prompt_mapping, token_mapping, self.get_active_loras(req_ids)

    def get_active_loras(self, req_ids: list[str]) -> list[LoRARequest]:
        """The adapters of these requests, one per lora_int_id. (Not a set:
        LoRARequests compare by name, and a server may reload a name under a
        new id while requests of the old load still run.)"""
        requests = self.lora_requests
        by_id = {requests[r].lora_int_id: requests[r] for r in req_ids if r in requests}
        return list(by_id.values())
