"""Hand-driven scheduler outputs in Model Runner V2 form, on top of the V1
worker tests' `ScriptedScheduler` (block allocation, bookkeeping).

The V2 difference: every new request carries `prefill_token_ids`, and a
request resumed after preemption comes back as a *new* request whose
`prefill_token_ids` are its prompt plus every token it generated, with fresh
blocks; `CachedRequestData` only ever holds running requests.
"""

from __future__ import annotations

import dataclasses

import torch

from tests.v1.worker.utils import (
    ScriptedRequest,
    ScriptedScheduler,
    make_kv_cache_config,
    make_vllm_config,
)
from vllm.v1.core.sched.output import NewRequestData


class V2ScriptedScheduler(ScriptedScheduler):
    """`ScriptedScheduler.step` in V2 form: `new` and `resumed` requests are
    sent as NewRequestData with their prefill_token_ids."""

    def _sent_as_new(self, req_id: str, new: tuple[str, ...], resumed: tuple[str, ...]) -> bool:
        return req_id in new or req_id in resumed

    def _new_request_data(self, req_id: str, req: ScriptedRequest) -> NewRequestData:
        return dataclasses.replace(
            super()._new_request_data(req_id, req), prefill_token_ids=req.prompt + req.outputs
        )

    def _resend_token_ids(self, req: ScriptedRequest) -> bool:
        return False  # V2 keeps running requests' tokens on the worker side


def make_v2_runner(model_dir: str, **overrides):
    """A V2 GPUModelRunner on CPU with its model loaded and KV cache bound."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    # The scripted scheduler reads each step's output at once (no async output).
    overrides.setdefault("async_scheduling", False)
    runner = GPUModelRunner(make_vllm_config(model_dir, **overrides), torch.device("cpu"))
    runner.load_model()
    runner.initialize_kv_cache(make_kv_cache_config(runner.get_kv_cache_spec()))
    return runner
