"""Model Runner V2 (upstream: vllm/v1/worker/gpu/model_runner.py).

Same class name and worker-facing surface as the V1 runner, different design:
every request keeps one row of `RequestState` (and of the block tables and
sampling states) until it finishes or is preempted; a step's inputs are
gathered on the device through `idx_mapping` (batch position -> row); host-side
changes are staged and applied once per step; sampling is Gumbel-max keyed by
(seed, position). Input prep lives in input_batch.py, attention metadata in
attn_utils.py, CUDA graphs in cudagraph_utils.py, pipeline-parallel token
exchange in pp_utils.py.

Step order (`execute_model`), as upstream: `finish_requests` (upstream's
`free_states` frees encoder-cache entries, which this build does not have),
`add_requests`, `update_requests`, `apply_staged_writes`,
`gather_batch_req_state`, `dispatch_cg_and_sync_dp`, `prepare_inputs`,
`prepare_attn`, forward (or graph replay) and the logits of each request's last
token. `sample_tokens` then samples, records the tokens on the device
(`postprocess`) and returns the output, an `AsyncOutput` under async scheduling.

Speculative decoding (eagle / eagle3, spec_decode/): a step verifying drafts
has 1 + drafts logits rows per request (`draft_layout`; the drafts come from
the request rows' `draft_tokens`, on the device), the rejection sampler
replaces the Sampler, and after `postprocess` the speculator drafts the next
step's tokens from this step's hidden states and attention metadata. The
runner then keeps its own computed-token counts (less the rejected drafts),
which async scheduling needs; such steps run eagerly.

LoRA (vllm/v1/worker/lora_model_runner_mixin.py): each row's adapter lives in
`LoraState` (lora_utils.py); the step's mapping, in batch order, is set right
after `prepare_inputs`; a step with adapters runs eagerly (graphs hold none).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch
import torch.nn as nn

from vllm.config.compilation import CUDAGraphMode
from vllm.distributed import get_pp_group
from vllm.forward_context import set_forward_context
from vllm.logger import init_logger
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
from vllm.v1.structured_output.utils import apply_grammar_bitmask
from vllm.v1.worker import kv_cache_setup
from vllm.v1.worker.cudagraph_padding import PaddedBatch, resolve_cudagraph_mode
from vllm.v1.worker.gpu import dummy_run
from vllm.v1.worker.gpu.async_utils import AsyncOutput
from vllm.v1.worker.gpu.attn_utils import (
    build_batch_attn_metadata,
    decodes_first_order,
    get_reorder_batch_threshold,
)
from vllm.v1.worker.gpu.block_table import BlockTables
from vllm.v1.worker.gpu.buffer_utils import async_copy_to_gpu
from vllm.v1.worker.gpu.cudagraph_utils import (
    BatchExecutionDescriptor,
    CudaGraphManager,
    build_padded_attn_metadata,
    dispatch_and_plan,
    pad_input_buffers,
)
from vllm.v1.worker.gpu.input_batch import (
    InputBatch,
    InputBuffers,
    copy_query_start_loc,
    num_sampled_and_rejected,
    post_update,
    prepare_token_inputs,
)
from vllm.v1.worker.gpu.lora_utils import LoraState
from vllm.v1.worker.gpu.pp_utils import pp_broadcast, pp_receive
from vllm.v1.worker.gpu.sample.prompt_logprob import PromptLogprobsWorker
from vllm.v1.worker.gpu.sample.sampler import Sampler
from vllm.v1.worker.gpu.spec_decode.utils import (
    DraftTokensHandler,
    draft_layout,
    split_model_output,
)
from vllm.v1.worker.gpu.states import RequestState
from vllm.v1.worker.lora_model_runner_mixin import LoRAModelRunnerMixin
from vllm.v1.worker.utils import (
    AttentionGroup,
    LayerKVCache,
    TextGenerationModel,
    as_text_generation_model,
    get_model_config,
    resolved_dtype,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
    from vllm.v1.outputs import DraftTokenIds, SamplerOutput
    from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator
    from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

logger = init_logger(__name__)


class ExecuteModelState(NamedTuple):
    """What `execute_model` leaves for the `sample_tokens` call that follows."""

    scheduler_output: SchedulerOutput
    input_batch: InputBatch
    # [num_tokens, hidden] (prompt logprobs); None before the last PP stage.
    hidden_states: torch.Tensor | None
    logits: torch.Tensor | None  # [num_logits, vocab]
    # Speculative decoding: the target's EAGLE-3 aux states (each [num_tokens,
    # hidden]) and the step's attention metadata (the drafter's first pass).
    aux_hidden_states: list[torch.Tensor] | None = None
    attn_metadata: dict[str, Any] | None = None


class GPUModelRunner(LoRAModelRunnerMixin):
    """Owns the model, the KV cache, the request rows and the sampler."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        self.vllm_config = vllm_config
        self.model_config = get_model_config(vllm_config)
        self.cache_config = vllm_config.cache_config
        self.scheduler_config = vllm_config.scheduler_config
        self.lora_config = vllm_config.lora_config
        self.device = device
        self.dtype = resolved_dtype(self.model_config)
        self.vocab_size = self.model_config.get_vocab_size()
        self.max_model_len = self.model_config.max_model_len
        self.max_num_tokens = self.scheduler_config.max_num_batched_tokens
        self.max_num_reqs = self.scheduler_config.max_num_seqs
        self.use_async_scheduling = bool(self.scheduler_config.async_scheduling)
        spec = vllm_config.speculative_config
        # k draft tokens per request and step (0: no speculative decoding).
        self.num_speculative_steps = int(spec.num_speculative_tokens or 0) if spec else 0

        self.req_states = RequestState(
            self.max_num_reqs,
            self.max_model_len,
            self.max_num_tokens,
            self.num_speculative_steps,
            self.vocab_size,
            device,
        )
        self.input_buffers = InputBuffers(self.max_num_reqs, self.max_num_tokens, device)
        self.lora_state = LoraState(self.max_num_reqs)
        self.sampler = Sampler(
            self.max_num_reqs,
            self.vocab_size,
            device,
            logprobs_mode=self.model_config.logprobs_mode,
            seed=self.model_config.seed,
        )
        self.prompt_logprobs_worker = PromptLogprobsWorker(self.vocab_size)
        self.speculator: EagleSpeculator | None = None
        self.rejection_sampler: RejectionSampler | None = None
        self.draft_tokens_handler = DraftTokensHandler()
        if spec is not None:
            from vllm.v1.worker.gpu.spec_decode import init_speculator
            from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler

            self.speculator = init_speculator(vllm_config, device)
            self.rejection_sampler = RejectionSampler(self.sampler, self.num_speculative_steps)
        # Without drafts request i owns logits row i: cu_num_logits = arange.
        self._arange_np = np.arange(self.max_num_reqs + 1, dtype=np.int32)
        self._arange = torch.from_numpy(self._arange_np).to(device)
        # Read-only: tokens sampled / drafts rejected by a step without prefills.
        self._ones = torch.ones(self.max_num_reqs, dtype=torch.int32, device=device)
        self._zeros = torch.zeros(self.max_num_reqs, dtype=torch.int32, device=device)
        self.output_copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.cudagraph_manager = CudaGraphManager(vllm_config, device)

        self.model: TextGenerationModel | None = None
        self.kv_cache_config: KVCacheConfig | None = None
        self.kv_caches: list[LayerKVCache] = []
        self.attn_groups: list[list[AttentionGroup]] = []
        self.block_tables: BlockTables | None = None
        self.reorder_batch_threshold: int | None = None
        self.execute_model_state: ExecuteModelState | None = None

    # ---- model and KV cache ------------------------------------------------------
    def load_model(self) -> None:
        from vllm.compilation.decorators import maybe_compile_model
        from vllm.model_executor.model_loader import get_model

        logger.info(
            "Loading model %s on %s (Model Runner V2)", self.model_config.model, self.device
        )
        model = get_model(vllm_config=self.vllm_config)
        if self.speculator is not None:
            # Before LoRA and compilation: the head shares the target's
            # embeddings / LM head and (EAGLE-3) sets its aux layers.
            self.speculator.load_model(model)
        # The weights' bytes as loaded (quantized ones at their packed size).
        self.model_memory_usage: int = getattr(model, "model_weight_bytes", 0)
        if self.lora_config is not None:
            # LoRA layers go in before torch.compile and graph capture.
            model = self.load_lora_model(model, self.vllm_config, self.device)
        # No-op unless compilation_config.mode asks for torch.compile.
        model = maybe_compile_model(
            model,
            self.vllm_config.compilation_config,
            self.device,
            vllm_config=self.vllm_config,
        )
        self.model = as_text_generation_model(model)

    def get_model(self) -> nn.Module:
        """The loaded model (upstream's accessor: the worker's sleep and
        pipeline checks need the module)."""
        model = self._loaded_model()
        assert isinstance(model, nn.Module), f"the model is a {type(model).__name__}"
        return model

    def _loaded_model(self) -> TextGenerationModel:
        """The model as the runner calls it (forward, compute_logits)."""
        assert self.model is not None, "load_model() has not run"
        return self.model

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return kv_cache_setup.get_kv_cache_spec(self.vllm_config)

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        """KV cache tensors, metadata builders, one block table per KV cache group."""
        self.kv_cache_config = kv_cache_config
        block_sizes = [g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups]
        self.block_tables = BlockTables(
            block_sizes, self.max_num_reqs, self.max_num_tokens, self.max_model_len, self.device
        )
        self.attn_groups = kv_cache_setup.make_attn_groups(
            kv_cache_config, self.vllm_config, self.device
        )
        self.reorder_batch_threshold = get_reorder_batch_threshold(self.attn_groups)
        self.kv_caches = kv_cache_setup.allocate_and_bind_kv_caches(
            kv_cache_config, self.attn_groups, self.vllm_config, self.device
        )
        self.cudagraph_manager.initialize(
            resolve_cudagraph_mode(self.vllm_config, self.attn_groups)
        )

    def capture_model(self) -> int:
        """Capture the full graphs (worker, after warm-up); returns how many
        (none with a speculator: those steps run eagerly)."""
        if self.speculator is not None:
            if self.cudagraph_manager.cudagraph_mode != CUDAGraphMode.NONE:
                logger.warning_once(
                    "CUDA graphs with speculative decoding on Model Runner V2 are not "
                    "built yet: cudagraph_mode %s is not captured; steps run eagerly.",
                    self.cudagraph_manager.cudagraph_mode.name,
                )
            return 0
        return self.cudagraph_manager.capture(self._prepare_capture_batch, self._loaded_model())

    def _block_tables(self) -> BlockTables:
        if self.block_tables is None:
            raise RuntimeError("initialize_kv_cache() must run before the first step.")
        return self.block_tables

    # ---- request state updates -------------------------------------------------------
    def finish_requests(self, scheduler_output: SchedulerOutput) -> None:
        """Finished and preempted requests give up their rows (V2 treats a
        preemption like a finish; the request comes back as a new one)."""
        finished = scheduler_output.finished_req_ids
        preempted = scheduler_output.preempted_req_ids
        for req_id in finished.union(preempted) if preempted else finished:
            self.req_states.remove_request(req_id)
            self.lora_state.remove_request(req_id)
            self.prompt_logprobs_worker.remove_request(req_id)

    def add_requests(self, scheduler_output: SchedulerOutput) -> None:
        block_tables = self._block_tables()
        for new_req in scheduler_output.scheduled_new_reqs:
            # Under V2 the scheduler sends the tokens to prefill with every new
            # request: the prompt, plus the outputs of a resumed request.
            assert new_req.prefill_token_ids is not None, (
                f"request {new_req.req_id}: prefill_token_ids missing (resumed requests "
                "must carry prompt + generated tokens under Model Runner V2)"
            )
            if new_req.prompt_token_ids is None or new_req.sampling_params is None:
                raise ValueError(
                    f"Request {new_req.req_id}: prompt embeddings and pooling "
                    "requests are not supported."
                )
            req_idx = self.req_states.add_request(
                new_req.req_id,
                prompt_len=len(new_req.prompt_token_ids),
                all_token_ids=new_req.prefill_token_ids,
                num_computed_tokens=new_req.num_computed_tokens,
            )
            block_tables.append_block_ids(req_idx, new_req.block_ids, overwrite=True)
            self.lora_state.add_request(new_req.req_id, req_idx, new_req.lora_request)
            self.sampler.add_request(
                req_idx, len(new_req.prompt_token_ids), new_req.sampling_params
            )
            self.prompt_logprobs_worker.add_request(
                new_req.req_id,
                new_req.prompt_token_ids,
                len(new_req.prefill_token_ids),
                new_req.sampling_params,
            )

    def update_requests(self, scheduler_output: SchedulerOutput) -> None:
        """Cached requests: the scheduler's computed-token counts, and new blocks."""
        cached = scheduler_output.scheduled_cached_reqs
        if not cached.req_ids:
            return
        assert not cached.resumed_req_ids, "V2 receives resumed requests as new requests"
        req_indices = self.req_states.get_req_indices(cached.req_ids)
        if self.speculator is None:
            self.req_states.set_num_computed_tokens(
                req_indices, np.asarray(cached.num_computed_tokens, dtype=np.int32)
            )
        # With drafts the runner keeps its own counts (advanced by the tokens
        # scheduled minus the drafts rejected, device and host, in
        # `postprocess`): under async scheduling the scheduler's count still
        # assumes the in-flight step's drafts are all accepted.
        block_tables = self._block_tables()
        for i, new_block_ids in enumerate(cached.new_block_ids):
            if new_block_ids is not None:
                block_tables.append_block_ids(int(req_indices[i]), new_block_ids, overwrite=False)

    def apply_staged_writes(self) -> None:
        self.req_states.apply_staged_writes()
        self._block_tables().apply_staged_writes()
        self.sampler.apply_staged_writes()

    # ---- inputs ------------------------------------------------------------------
    def gather_batch_req_state(
        self, scheduler_output: SchedulerOutput
    ) -> tuple[list[str], np.ndarray, np.ndarray]:
        """The step's batch order: (req_ids, idx_mapping_np, num_scheduled_tokens),
        the scheduler's order with decodes first if the backend asks for it."""
        tokens_per_req = scheduler_output.num_scheduled_tokens
        num_reqs = len(tokens_per_req)
        req_ids = list(tokens_per_req)
        num_scheduled = np.fromiter(tokens_per_req.values(), dtype=np.int32, count=num_reqs)
        order = decodes_first_order(num_scheduled, self.reorder_batch_threshold)
        if order is not None:
            req_ids = list(operator.itemgetter(*order)(req_ids))
            num_scheduled = num_scheduled[order]
        return req_ids, self.req_states.get_req_indices(req_ids), num_scheduled

    def dispatch_cg_and_sync_dp(
        self, num_scheduled: np.ndarray, num_tokens: int, has_lora: bool = False
    ) -> tuple[BatchExecutionDescriptor | None, PaddedBatch]:
        """The CUDA graph for this batch (None: eager; always with LoRA
        adapters in it) and its padding. No data parallelism here, so there
        are no ranks to agree with."""
        return dispatch_and_plan(
            self.cudagraph_manager,
            num_scheduled,
            num_tokens,
            self.max_num_reqs,
            self.max_model_len,
            has_lora,
        )

    def prepare_inputs(
        self,
        scheduler_output: SchedulerOutput,
        batch_order: tuple[list[str], np.ndarray, np.ndarray] | None = None,
        padded: PaddedBatch | None = None,
    ) -> InputBatch:
        """Gather the batch's rows and build its inputs on the device (in
        `batch_order`, default `gather_batch_req_state`'s), padded as `padded` says."""
        req_ids, idx_mapping_np, num_scheduled = batch_order or self.gather_batch_req_state(
            scheduler_output
        )
        num_reqs, num_tokens = len(req_ids), scheduler_output.total_num_scheduled_tokens
        bufs = self.input_buffers
        idx_mapping = async_copy_to_gpu(idx_mapping_np, device=self.device)
        query_start_loc, qsl_np = copy_query_start_loc(num_scheduled, bufs.query_start_loc)
        # Request i owns logits rows cu_num_logits[i]..: 1 + its drafts.
        layout = draft_layout(
            scheduler_output.scheduled_spec_decode_tokens,
            req_ids,
            idx_mapping,
            idx_mapping_np,
            (self._arange, self._arange_np),
            self.speculator is not None,
        )
        logits_indices, num_computed_np = prepare_token_inputs(
            bufs,
            self.req_states,
            idx_mapping,
            idx_mapping_np,
            query_start_loc,
            layout.cu_num_logits,
            num_tokens,
            int(layout.cu_num_logits_np[-1]),
        )
        num_padded = num_tokens
        if padded is not None:  # after the writes above (they zero seq_lens past num_reqs)
            pad_input_buffers(padded, bufs)
            num_padded = padded.num_tokens_padded

        return InputBatch(
            req_ids=req_ids,
            num_reqs=num_reqs,
            idx_mapping=idx_mapping,
            idx_mapping_np=idx_mapping_np,
            expanded_idx_mapping=layout.expanded_idx_mapping,
            num_scheduled_tokens=num_scheduled,
            num_tokens=num_tokens,
            num_tokens_after_padding=num_padded,
            num_draft_tokens=layout.num_draft_tokens,
            query_start_loc=query_start_loc,
            query_start_loc_np=qsl_np,
            seq_lens=bufs.seq_lens[:num_reqs],
            seq_lens_np=num_computed_np + num_scheduled,
            num_computed_tokens_np=num_computed_np,
            input_ids=bufs.input_ids[:num_padded],
            positions=bufs.positions[:num_padded],
            logits_indices=logits_indices,
            cu_num_logits=layout.cu_num_logits,
            cu_num_logits_np=layout.cu_num_logits_np,
            has_structured_output_reqs=scheduler_output.has_structured_output_requests,
        )

    def prepare_attn(
        self, input_batch: InputBatch, padded: PaddedBatch | None = None
    ) -> dict[str, Any]:
        """Block tables and slot mappings gathered on the device, then each
        attention group's metadata (over the padded batch when padded)."""
        block_tables = self._block_tables()
        tables = block_tables.gather_block_tables(input_batch.idx_mapping)
        slot_mappings = block_tables.compute_slot_mappings(
            input_batch.idx_mapping,
            input_batch.query_start_loc,
            input_batch.positions[: input_batch.num_tokens],
        )
        if padded is not None and len(padded.pad_query_lens):
            return build_padded_attn_metadata(
                self.attn_groups, input_batch, padded, self.input_buffers, block_tables
            )
        return build_batch_attn_metadata(self.attn_groups, input_batch, tables, slot_mappings)

    # ---- one step --------------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(
        self, scheduler_output: SchedulerOutput, intermediate_tensors: Any = None
    ) -> ModelRunnerOutput | None:
        """Update the request rows and run the forward pass; returns None and
        leaves the logits for `sample_tokens` (EMPTY_MODEL_RUNNER_OUTPUT when
        nothing is scheduled). Under pipeline parallelism a later stage starts
        from `intermediate_tensors`; a stage before the last returns its own."""
        if self.execute_model_state is not None:
            raise RuntimeError("execute_model() called twice without sample_tokens().")
        self.finish_requests(scheduler_output)
        self.add_requests(scheduler_output)
        self.update_requests(scheduler_output)
        self.apply_staged_writes()
        if scheduler_output.total_num_scheduled_tokens == 0:
            return EMPTY_MODEL_RUNNER_OUTPUT
        batch_order = self.gather_batch_req_state(scheduler_output)
        has_lora = self.lora_config is not None and bool(
            self.lora_state.get_active_loras(batch_order[0])
        )
        padded: PaddedBatch | None
        cg_desc, padded = self.dispatch_cg_and_sync_dp(
            batch_order[2], scheduler_output.total_num_scheduled_tokens, has_lora
        )
        if self.speculator is not None:
            # Eager, unpadded: the drafter's first pass reuses the step's
            # inputs and attention metadata (no graphs captured with drafts).
            cg_desc, padded = None, None
        input_batch = self.prepare_inputs(scheduler_output, batch_order, padded)
        if self.lora_config is not None:
            # Before every forward: the step's token -> adapter mapping.
            self._set_active_loras(
                *self.lora_state.make_lora_inputs(
                    input_batch.req_ids,
                    input_batch.idx_mapping_np,
                    input_batch.num_scheduled_tokens,
                )
            )
        attn_metadata = self.prepare_attn(input_batch, padded)
        output, logits = self._run_model(input_batch, attn_metadata, intermediate_tensors, cg_desc)
        if logits is None:  # a stage before the last: hand its tensors on
            self.execute_model_state = ExecuteModelState(scheduler_output, input_batch, None, None)
            return output
        hidden_states, aux_hidden_states = split_model_output(output, input_batch.num_tokens)
        self.execute_model_state = ExecuteModelState(
            scheduler_output, input_batch, hidden_states, logits, aux_hidden_states, attn_metadata
        )
        return None

    def _run_model(
        self,
        input_batch: InputBatch,
        attn_metadata: dict[str, Any] | None,
        intermediate_tensors: Any = None,
        cg_desc: BatchExecutionDescriptor | None = None,
    ) -> tuple[Any, torch.Tensor | None]:
        """Forward pass (a graph replay when `cg_desc` has a captured graph:
        the full graph, or the model's pieces under PIECEWISE; else eager over
        the same, possibly padded, inputs): (hidden states
        [num_tokens, hidden], logits of the sampled rows [num_logits, vocab]);
        on a pipeline stage before the last, (IntermediateTensors, None)."""
        model = self._loaded_model()
        manager = self.cudagraph_manager
        if cg_desc is not None and not manager.has_graph(cg_desc):
            cg_desc = None
        if cg_desc is not None and cg_desc.cg_mode == CUDAGraphMode.FULL:
            with set_forward_context(
                attn_metadata, self.vllm_config, num_tokens=input_batch.num_tokens_after_padding
            ):
                hidden_states = manager.run_fullgraph(cg_desc)
        else:
            context = (
                manager.forward_context(attn_metadata, cg_desc)
                if cg_desc is not None  # PIECEWISE: the model's pieces replay
                else set_forward_context(
                    attn_metadata,
                    self.vllm_config,
                    num_tokens=input_batch.num_tokens_after_padding,
                )
            )
            with context:
                hidden_states = model(
                    input_ids=input_batch.input_ids,
                    positions=input_batch.positions,
                    intermediate_tensors=intermediate_tensors,
                )
        if not get_pp_group().is_last_rank:
            return hidden_states, None
        # EAGLE-3 targets return (hidden states, aux hidden states).
        last, aux = split_model_output(hidden_states, input_batch.num_tokens)
        last = last[: input_batch.num_tokens]  # drop the padding
        logits = model.compute_logits(last[input_batch.logits_indices])
        return (last if aux is None else (last, aux)), logits

    @torch.inference_mode()
    def sample_tokens(
        self, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | AsyncOutput | None:
        """Sample from the preceding `execute_model`'s logits, masked by the
        step's grammar bitmask first, and record the tokens in the request
        rows, on the device."""
        state = self.execute_model_state
        if state is None:
            return None
        self.execute_model_state = None
        scheduler_output, input_batch, hidden_states, logits = state[:4]
        if logits is None:
            self._receive_pp_sampled_tokens(input_batch)
            return None
        assert hidden_states is not None  # the last stage has both
        if grammar_output is not None:
            # The batch order may differ from the scheduler's (decodes first):
            # the bitmask rows are matched to input_batch.req_ids by request id.
            apply_grammar_bitmask(scheduler_output, grammar_output, input_batch, logits)
        sampler_output, num_sampled, num_rejected = self._sample(input_batch, logits)
        pp_broadcast(sampler_output.sampled_token_ids)  # the earlier stages record them too
        output = ModelRunnerOutput(
            req_ids=input_batch.req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(input_batch.req_ids)},
            sampled_token_ids=[],
            prompt_logprobs_dict=self.prompt_logprobs_worker.compute_prompt_logprobs(
                self._loaded_model().compute_logits,
                hidden_states,
                input_batch,
                self._lora_logits_rows_hook(input_batch),
            ),
        )
        async_output = AsyncOutput(
            output,
            sampler_output,
            num_sampled,
            self.output_copy_stream,
            input_batch.cu_num_logits_np if input_batch.num_draft_tokens else None,
        )
        # After AsyncOutput: the host copy is already queued behind the sampler.
        sampled = sampler_output.sampled_token_ids
        if self.speculator is None:
            self.postprocess(input_batch, sampled, num_sampled, num_rejected)
        else:
            self._postprocess_and_propose(state, sampled, num_sampled, num_rejected)
        return async_output if self.use_async_scheduling else async_output.get_output()

    def _sample(
        self, input_batch: InputBatch, logits: torch.Tensor
    ) -> tuple[SamplerOutput, torch.Tensor, torch.Tensor]:
        """(sampler output with sampled_token_ids [num_reqs, 1 or k + 1],
        tokens emitted [num_reqs], drafts rejected [num_reqs]): the Sampler,
        or the rejection sampler when the step verifies drafts."""
        all_token_ids = self.req_states.all_token_ids.gpu
        if input_batch.num_draft_tokens == 0 or self.rejection_sampler is None:
            # Each logits row is sampled at its token's position (the noise key).
            pos = input_batch.positions[input_batch.logits_indices]
            sampler_output = self.sampler(
                logits,
                input_batch.expanded_idx_mapping,
                input_batch.idx_mapping_np,
                pos,
                input_batch.seq_lens_np,
                all_token_ids,
            )
            return sampler_output, *self._num_sampled_and_rejected(input_batch)
        return self.rejection_sampler(
            logits, input_batch, all_token_ids, self.req_states.prefill_len.gpu
        )

    def _postprocess_and_propose(
        self,
        state: ExecuteModelState,
        sampled: torch.Tensor,
        num_sampled: torch.Tensor,
        num_rejected: torch.Tensor,
    ) -> None:
        """`postprocess`, then the next step's drafts, into the request rows
        (device) and the handler the engine takes them from. The host needs
        the rejections now (its computed-token counts and the drafter's
        layout): one small device-to-host copy."""
        assert self.speculator is not None and state.hidden_states is not None
        batch = state.input_batch
        num_rejected_np = num_rejected.cpu().numpy()
        self.postprocess(batch, sampled, num_sampled, num_rejected, num_rejected_np)
        drafts, num_drafts = self.speculator.propose(
            batch,
            state.attn_metadata or {},
            state.hidden_states,
            state.aux_hidden_states,
            sampled,
            num_sampled,
            num_rejected_np,
            self.req_states.prefill_len.np,
            self.req_states.all_token_ids.gpu,
            self._block_tables(),
            self.attn_groups,
        )
        self.req_states.draft_tokens[batch.idx_mapping.to(torch.int64)] = drafts
        self.draft_tokens_handler.set_draft_tokens(batch.req_ids, drafts, num_drafts)

    def _lora_logits_rows_hook(self, input_batch: InputBatch) -> Callable[[int, int], None] | None:
        """With LoRA: before prompt logprobs compute `n` logits rows of batch
        position `i`, key those rows to that request's adapter."""
        if self.lora_config is None:
            return None
        lora_ids = self.lora_state.lora_ids[input_batch.idx_mapping_np]

        def hook(i: int, n: int) -> None:
            self.set_lora_logits_rows(np.full(n, lora_ids[i], dtype=np.int64))

        return hook

    def _receive_pp_sampled_tokens(self, input_batch: InputBatch) -> None:
        """A stage before the last records the last stage's tokens as if it had
        sampled them, so the next step's inputs are right on every stage."""
        sampled = pp_receive(len(input_batch.logits_indices), self.device)
        num_sampled, num_rejected = self._num_sampled_and_rejected(input_batch)
        self.postprocess(input_batch, sampled, num_sampled, num_rejected)

    def _num_sampled_and_rejected(self, batch: InputBatch) -> tuple[torch.Tensor, torch.Tensor]:
        prefill_len = self.req_states.prefill_len
        return num_sampled_and_rejected(
            batch, prefill_len.np, prefill_len.gpu, self._ones, self._zeros
        )

    def postprocess(
        self,
        input_batch: InputBatch,
        sampled_tokens: torch.Tensor,
        num_sampled: torch.Tensor,
        num_rejected: torch.Tensor,
        num_rejected_np: np.ndarray | None = None,
    ) -> None:
        """Append the sampled tokens to the rows and advance the counters (device),
        and the host mirrors of the computed-token counts (by the tokens
        scheduled, less `num_rejected_np` when the step verified drafts)."""
        states = self.req_states
        post_update(
            input_batch.idx_mapping,
            states.num_computed_tokens.gpu,
            states.last_sampled_tokens,
            sampled_tokens,
            num_sampled,
            num_rejected,
            input_batch.query_start_loc,
            states.all_token_ids.gpu,
            states.total_len.gpu,
        )
        num_computed = input_batch.num_scheduled_tokens
        if num_rejected_np is not None:
            num_computed = num_computed - num_rejected_np.astype(num_computed.dtype)
        states.advance_host_counts(input_batch.idx_mapping_np, num_computed)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts the last step proposed (once; None without a speculator)."""
        return self.draft_tokens_handler.get_draft_tokens()

    # ---- dummy runs (warm-up, memory profiling and graph capture: dummy_run.py) ------
    @torch.inference_mode()
    def _dummy_run(
        self, num_tokens: int, use_kv_cache: bool = True, num_reqs: int | None = None
    ) -> torch.Tensor:
        return dummy_run.run_dummy_batch(self, num_tokens, use_kv_cache, num_reqs)

    def _prepare_capture_batch(
        self, desc: BatchExecutionDescriptor
    ) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
        return dummy_run.prepare_capture_batch(self, desc)

    @torch.inference_mode()
    def _dummy_sampler_run(self, hidden_states: torch.Tensor) -> None:
        dummy_run.dummy_sampler_run(self, hidden_states)

    def profile_run(self) -> None:
        """The largest step the scheduler can produce, without a KV cache."""
        self._dummy_sampler_run(self._dummy_run(self.max_num_tokens, use_kv_cache=False))
