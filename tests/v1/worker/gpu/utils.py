"""Hand-driven scheduler outputs in Model Runner V2 form, on top of the V1
worker tests' `ScriptedScheduler` (block allocation, bookkeeping).

The V2 difference: every new request carries `prefill_token_ids`, and a
request resumed after preemption comes back as a *new* request whose
`prefill_token_ids` are its prompt plus every token it generated, with fresh
blocks; `CachedRequestData` only ever holds running requests.
"""
from __future__ import annotations

import torch

from tests.v1.worker.utils import ScriptedScheduler, make_kv_cache_config, make_vllm_config
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput


class V2ScriptedScheduler(ScriptedScheduler):

    def step(self, schedule: dict[str, int], new: tuple[str, ...] = (),
             resumed: tuple[str, ...] = (), preempted: tuple[str, ...] = ()
             ) -> dict[str, list[int]]:
        """One step; `new` and `resumed` requests are sent as NewRequestData."""
        new_reqs, cached = [], CachedRequestData.make_empty()
        for req_id, n in schedule.items():
            req = self.reqs[req_id]
            assert req.num_computed + n <= req.num_tokens
            new_blocks = self._grow(req, req.num_computed + n)
            if req_id in new or req_id in resumed:
                new_reqs.append(NewRequestData(
                    req_id=req_id, prompt_token_ids=req.prompt, mm_features=[],
                    sampling_params=req.params, pooling_params=None,
                    block_ids=(list(req.blocks),), num_computed_tokens=req.num_computed,
                    lora_request=None, prefill_token_ids=req.prompt + req.outputs))
                continue
            cached.req_ids.append(req_id)
            cached.new_block_ids.append((new_blocks,) if new_blocks else None)
            cached.num_computed_tokens.append(req.num_computed)
            cached.num_output_tokens.append(len(req.outputs))
        so = SchedulerOutput(
            scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
            num_scheduled_tokens=dict(schedule),
            total_num_scheduled_tokens=sum(schedule.values()),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0], finished_req_ids=self.pending_finished,
            free_encoder_mm_hashes=[], preempted_req_ids=set(preempted))
        self.pending_finished = set()
        for req_id in preempted:
            self.preempt(req_id)
        return self._run(so, schedule)


def make_v2_runner(model_dir: str, **overrides):
    """A V2 GPUModelRunner on CPU with its model loaded and KV cache bound."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    # The scripted scheduler reads each step's output at once (no async output).
    overrides.setdefault("async_scheduling", False)
    runner = GPUModelRunner(make_vllm_config(model_dir, **overrides), torch.device("cpu"))
    runner.load_model()
    runner.initialize_kv_cache(make_kv_cache_config(runner.get_kv_cache_spec()))
    return runner
