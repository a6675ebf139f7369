"""A hand-driven "scheduler" for worker tests: it builds the SchedulerOutputs a
real scheduler would send (V1 form) for a scripted sequence of steps, hands out
block ids, and records what the worker sampled."""

from __future__ import annotations

from dataclasses import dataclass, field

from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.utils import cdiv
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

BLOCK_SIZE = 4
NUM_BLOCKS = 96


def make_vllm_config(model_dir: str, **overrides):
    kwargs = dict(
        model=model_dir,
        dtype="float32",
        max_model_len=128,
        block_size=BLOCK_SIZE,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        device="cpu",
        kv_cache_memory_bytes=1 << 22,
        enable_prefix_caching=False,
    )
    kwargs.update(overrides)
    return EngineArgs(**kwargs).create_engine_config()


def make_kv_cache_config(kv_cache_spec: dict, num_blocks: int = NUM_BLOCKS) -> KVCacheConfig:
    """Every layer in one group (all full attention), one tensor per layer."""
    names = sorted(kv_cache_spec)
    spec = kv_cache_spec[names[0]]
    assert all(kv_cache_spec[n] == spec for n in names)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[
            KVCacheTensor(size=spec.page_size_bytes * num_blocks, shared_by=[n]) for n in names
        ],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec)],
    )


@dataclass
class ScriptedRequest:
    prompt: list[int]
    params: SamplingParams
    outputs: list[int] = field(default_factory=list)
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    # Scheduled in the previous step (decides whether all_token_ids is sent).
    scheduled_last_step: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.outputs)


class ScriptedScheduler:
    """Drives a worker step by step. Block 0 is the null block, as in the
    real block pool, so ids start at 1."""

    def __init__(self, worker) -> None:
        self.worker = worker
        self.reqs: dict[str, ScriptedRequest] = {}
        self.next_block = 1
        # Freed blocks are handed out again first, so stale block ids on the
        # worker side would corrupt another request's KV.
        self.free_blocks: list[int] = []
        self.pending_finished: set[str] = set()
        self.outputs_per_step: list[dict[str, list[int]]] = []

    def add(self, req_id: str, prompt: list[int], params: SamplingParams) -> None:
        self.reqs[req_id] = ScriptedRequest(list(prompt), params)

    def _grow(self, req: ScriptedRequest, num_tokens: int) -> list[int]:
        need = max(cdiv(num_tokens, BLOCK_SIZE) - len(req.blocks), 0)
        reused = self.free_blocks[:need]
        del self.free_blocks[:need]
        fresh = list(range(self.next_block, self.next_block + need - len(reused)))
        self.next_block += len(fresh)
        assert self.next_block <= NUM_BLOCKS, "test ran out of KV blocks"
        req.blocks += reused + fresh
        return reused + fresh

    def preempt(self, req_id: str) -> None:
        req = self.reqs[req_id]
        self.free_blocks += req.blocks
        req.num_computed, req.blocks = 0, []

    def finish(self, req_id: str) -> None:
        self.free_blocks += self.reqs.pop(req_id).blocks
        self.pending_finished.add(req_id)

    def step(
        self,
        schedule: dict[str, int],
        new: tuple[str, ...] = (),
        resumed: tuple[str, ...] = (),
        preempted: tuple[str, ...] = (),
    ) -> dict[str, list[int]]:
        """Run one step: `schedule` maps req id -> tokens to compute now."""
        new_reqs, cached = [], CachedRequestData.make_empty()
        for req_id, n in schedule.items():
            req = self.reqs[req_id]
            assert req.num_computed + n <= req.num_tokens
            new_blocks = self._grow(req, req.num_computed + n)
            if self._sent_as_new(req_id, new, resumed):
                new_reqs.append(self._new_request_data(req_id, req))
                continue
            cached.req_ids.append(req_id)
            if req_id in resumed:
                cached.resumed_req_ids.add(req_id)
                new_blocks = list(req.blocks)
            if self._resend_token_ids(req):
                cached.all_token_ids[req_id] = req.prompt + req.outputs
            cached.new_block_ids.append((new_blocks,) if new_blocks else None)
            cached.num_computed_tokens.append(req.num_computed)
            cached.num_output_tokens.append(len(req.outputs))
        so = SchedulerOutput(
            scheduled_new_reqs=new_reqs,
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=dict(schedule),
            total_num_scheduled_tokens=sum(schedule.values()),
            scheduled_spec_decode_tokens={},
            scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0],
            finished_req_ids=self.pending_finished,
            free_encoder_mm_hashes=[],
            preempted_req_ids=set(preempted),
        )
        self.pending_finished = set()
        for req_id in preempted:
            self.preempt(req_id)
        return self._run(so, schedule)

    # The V1 form of the three things Model Runner V2 does differently
    # (tests/v1/worker/gpu/utils.py overrides them).
    def _sent_as_new(self, req_id: str, new: tuple[str, ...], resumed: tuple[str, ...]) -> bool:
        """V1: only first-time requests; a resumed one is a cached request."""
        return req_id in new

    def _new_request_data(self, req_id: str, req: ScriptedRequest) -> NewRequestData:
        return NewRequestData(
            req_id=req_id,
            prompt_token_ids=req.prompt,
            mm_features=[],
            sampling_params=req.params,
            pooling_params=None,
            block_ids=(list(req.blocks),),
            num_computed_tokens=req.num_computed,
            lora_request=None,
        )

    def _resend_token_ids(self, req: ScriptedRequest) -> bool:
        """V1: a request not scheduled last step gets all its token ids again."""
        return not req.scheduled_last_step

    def _run(self, so: SchedulerOutput, schedule: dict[str, int]) -> dict[str, list[int]]:
        assert self.worker.execute_model(so) is None
        out = self.worker.sample_tokens(None)
        assert sorted(out.req_ids) == sorted(schedule)
        sampled = {rid: out.sampled_token_ids[out.req_id_to_index[rid]] for rid in out.req_ids}
        for req_id, req in self.reqs.items():
            req.scheduled_last_step = req_id in schedule
        for req_id, n in schedule.items():
            req = self.reqs[req_id]
            req.num_computed += n
            req.outputs += sampled[req_id]
        self.outputs_per_step.append(sampled)
        self.last_output = out
        return sampled

    def decode_all(self, req_ids: list[str], steps: int) -> None:
        for _ in range(steps):
            self.step({r: 1 for r in req_ids})
