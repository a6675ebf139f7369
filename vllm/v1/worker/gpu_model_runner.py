"""The V1 model runner (upstream: vllm/v1/worker/gpu_model_runner.py).

Despite the name it is device-agnostic: on a CPU device the "device" buffers
are the host buffers themselves and no copies happen.

One step is two calls, as upstream:
  execute_model(scheduler_output) -> None
      _update_states   apply the scheduler's diffs to the persistent batch
                       (vllm/v1/worker/gpu_state_updates.py)
      _prepare_inputs  token ids, positions, slots, query_start_loc (numpy,
                       vllm/v1/worker/gpu_step_inputs.py); the graph and the
                       padding to its size (CudaGraphManager.dispatch,
                       vllm/v1/worker/cudagraph_manager.py), the padded inputs
                       on the device with their attention metadata
                       (InputBuffers.commit, vllm/v1/worker/gpu_input_buffers.py)
      _model_forward   the forward (a CUDAGraphWrapper replay under FULL);
                       then the logits of the last scheduled token of every request
  sample_tokens(grammar_output) -> ModelRunnerOutput
      the structured-output bitmask masks the logits (rows found by request
      id), sampler, then write the sampled tokens back into the persistent
      batch (_sample / _bookkeeping_sync, vllm/v1/worker/gpu_sample_step.py);
      with async scheduling an AsyncGPUModelRunnerOutput instead, and the
      tokens reach the next step's inputs on the device
      (AsyncSampledTokens, vllm/v1/worker/async_sampled_tokens.py)

Loading the model and the KV cache set-up: vllm/v1/worker/gpu_model_setup.py
and vllm/v1/worker/kv_cache_setup.py.

Speculative decoding is the SpeculativeDecoder of
vllm/v1/worker/spec_decode_utils.py: the scheduled drafts join the step's
inputs, the logits hold each drafting request's draft rows and bonus row,
the rejection sampler emits a variable number of tokens per request, and
the next drafts are proposed after the step's bookkeeping. Under async
scheduling the scheduler sends placeholder drafts and counts the previous
step's drafts as accepted; AsyncSpecDrafts (vllm/v1/worker/async_spec_decode.py)
puts the runner's own drafts in and corrects the counts.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn as nn

from vllm.distributed import get_pp_group
from vllm.forward_context import set_forward_context
from vllm.logger import init_logger
from vllm.sequence import IntermediateTensors
from vllm.utils import is_pin_memory_available
from vllm.v1.outputs import (
    EMPTY_MODEL_RUNNER_OUTPUT,
    DraftTokenIds,
    LogprobsTensors,
    ModelRunnerOutput,
    SamplerOutput,
)
from vllm.v1.pool.metadata import PoolingStates
from vllm.v1.sample.logits_processor import build_logitsprocs
from vllm.v1.sample.sampler import Sampler
from vllm.v1.structured_output.utils import apply_grammar_bitmask
from vllm.v1.worker import kv_cache_setup
from vllm.v1.worker.async_sampled_tokens import AsyncGPUModelRunnerOutput, AsyncSampledTokens
from vllm.v1.worker.async_spec_decode import AsyncSpecDrafts
from vllm.v1.worker.cudagraph_manager import CudaGraphManager, unwrap_model
from vllm.v1.worker.cudagraph_padding import resolve_cudagraph_mode
from vllm.v1.worker.gpu_dummy_run import dummy_run, dummy_sampler_run
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch
from vllm.v1.worker.gpu_input_buffers import InputBuffers
from vllm.v1.worker.gpu_model_setup import (
    kv_block_sizes,
    load_target_model,
    reorder_batch_threshold,
)
from vllm.v1.worker.gpu_pooling import (
    dummy_pooler_run,
    pool_step,
    supported_pooling_tasks,
    token_type_ids_for_step,
)
from vllm.v1.worker.gpu_sample_step import (
    ExecuteModelState,
    bookkeeping_sync,
    propose_drafts,
    sample_step,
)
from vllm.v1.worker.gpu_state_updates import (
    add_new_pooling_request,
    add_new_request,
    remove_stale_requests,
    update_cached_requests,
)
from vllm.v1.worker.gpu_step_inputs import (
    PreparedInputs,
    discard_mask_for_step,
    fill_step_inputs,
    logits_indices_for_step,
    spec_step_and_loras,
)
from vllm.v1.worker.lora_model_runner_mixin import LoRAModelRunnerMixin
from vllm.v1.worker.prompt_logprobs import PromptLogprobsWorker
from vllm.v1.worker.spec_decode_utils import (
    SpecStep,
    SpeculativeDecoder,
    split_model_output,
    write_draft_tokens,
)
from vllm.v1.worker.utils import (
    AttentionGroup,
    LayerKVCache,
    TextGenerationModel,
    get_model_config,
    reorder_batch_to_split_decodes_and_prefills,
    resolved_dtype,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.core.sched.output import GrammarOutput, NewRequestData, SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

logger = init_logger(__name__)

__all__ = ["AsyncGPUModelRunnerOutput", "ExecuteModelState", "GPUModelRunner", "PreparedInputs"]


class GPUModelRunner(LoRAModelRunnerMixin):
    """Owns the model, the KV cache tensors, the persistent batch and input
    buffers, the sampler, and its parts: a CudaGraphManager, a
    PromptLogprobsWorker and, with async scheduling, the AsyncSampledTokens.
    LoRA (lora_model_runner_mixin.py): the step's adapter mapping is set in
    `_prepare_inputs`, before every forward."""

    model_memory_usage: int  # set by load_model: the weights' bytes as loaded

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        self.vllm_config = vllm_config
        self.model_config = get_model_config(vllm_config)
        self.cache_config = vllm_config.cache_config
        self.scheduler_config = vllm_config.scheduler_config
        self.lora_config = vllm_config.lora_config
        self.device = device
        self.pin_memory = is_pin_memory_available()
        self.dtype = resolved_dtype(self.model_config)

        self.max_model_len = self.model_config.max_model_len
        self.max_num_tokens = self.scheduler_config.max_num_batched_tokens
        self.max_num_reqs = self.scheduler_config.max_num_seqs
        self.vocab_size = self.model_config.get_vocab_size()
        # Pooling models (runner="pooling", always this runner): no sampler;
        # `execute_model` returns the pooler's outputs (gpu_pooling.py).
        self.is_pooling_model = self.model_config.runner_type == "pooling"
        self.pooling_states: dict[str, PoolingStates] = {}

        # The model, wrapped in a CUDAGraphWrapper when full graphs are on.
        self.model: TextGenerationModel | None = None
        self.cudagraph_manager = CudaGraphManager(vllm_config, device)
        self.sampler = Sampler(logprobs_mode=self.model_config.logprobs_mode)
        self.requests: dict[str, CachedRequestState] = {}
        self.prompt_logprobs_worker = PromptLogprobsWorker(self.vocab_size, device)
        self.input_batch = self._make_input_batch([self.cache_config.block_size])

        self.kv_cache_config: KVCacheConfig | None = None
        self.kv_caches: list[LayerKVCache] = []
        # Per KV cache group: its attention groups (one per backend).
        self.attn_groups: list[list[AttentionGroup]] = []
        self.reorder_batch_threshold: int | None = None

        self.input_buffers = InputBuffers(
            self.max_num_reqs, self.max_num_tokens, device, self.pin_memory
        )
        self.arange_np = np.arange(
            max(self.max_num_reqs + 1, self.max_model_len, self.max_num_tokens), dtype=np.int64
        )
        self.execute_model_state: ExecuteModelState | None = None
        # Async scheduling: the sampled ids go to the host on a side stream;
        # the event guards the pinned input buffers, which the next step
        # rewrites while this step's copies may still be queued.
        self.use_async_scheduling = bool(self.scheduler_config.async_scheduling)
        on_cuda = self.use_async_scheduling and device.type == "cuda"
        self.prepare_inputs_event = torch.cuda.Event() if on_cuda else None
        # Speculative decoding: drafter, rejection sampler, pending drafts.
        self.spec_decoder = (
            SpeculativeDecoder(vllm_config, device, self)
            if vllm_config.speculative_config is not None
            else None
        )
        self.drafter = self.spec_decoder.drafter if self.spec_decoder is not None else None
        # Async scheduling: without drafts the sampled ids stay on the device
        # until the next step's inputs (AsyncSampledTokens); with drafts each
        # step's emitted tokens go into the batch at once (the device is the
        # host here) and AsyncSpecDrafts mends the scheduler's optimistic view.
        use_async_spec = self.use_async_scheduling and self.spec_decoder is not None
        self.async_spec_drafts = AsyncSpecDrafts() if use_async_spec else None
        self.async_sampled_tokens = (
            AsyncSampledTokens(torch.cuda.Stream() if on_cuda else None)
            if self.use_async_scheduling and not use_async_spec
            else None
        )

    def _make_input_batch(self, block_sizes: list[int]) -> InputBatch:
        return InputBatch(
            max_num_reqs=self.max_num_reqs,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=self.max_num_tokens,
            device=self.device,
            pin_memory=self.pin_memory,
            vocab_size=self.vocab_size,
            block_sizes=block_sizes,
            logitsprocs=build_logitsprocs(
                self.vllm_config, self.device, self.pin_memory, self.is_pooling_model
            ),
        )

    # ---- model and KV cache --------------------------------------------------
    def load_model(self) -> None:
        """Load the target model (gpu_model_setup.py), then the drafter's."""
        add_lora = None
        if self.lora_config is not None:
            add_lora = partial(
                self.load_lora_model, vllm_config=self.vllm_config, device=self.device
            )
        model, self.model, self.model_memory_usage = load_target_model(
            self.vllm_config, self.device, add_lora, self.is_pooling_model
        )
        if self.drafter is not None:
            self.drafter.load_model(model)

    def get_model(self) -> nn.Module:
        """The loaded model, without the CUDAGraphWrapper (upstream's accessor:
        the worker's sleep and pipeline checks need the module)."""
        model = unwrap_model(self.model)
        assert isinstance(model, nn.Module), f"the model is a {type(model).__name__}"
        return model

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """KV cache spec of every attention layer the model registered."""
        return kv_cache_setup.get_kv_cache_spec(self.vllm_config)

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        """Allocate the KV cache tensors, bind them to the layers and build the
        attention metadata builders."""
        # Encoder-only layers get a cache-less group of their own (runner side only).
        kv_cache_config = kv_cache_setup.add_encoder_only_layers_to_kv_cache_config(
            kv_cache_config, self.vllm_config
        )
        self.kv_cache_config = kv_cache_config
        block_sizes = kv_block_sizes(kv_cache_config)
        if block_sizes != [self.cache_config.block_size]:
            # One block table per group; rebuild the (still empty) batch.
            assert not self.requests, "KV cache re-initialised with live requests"
            self.input_batch = self._make_input_batch(block_sizes)
        self.attn_groups = kv_cache_setup.make_attn_groups(
            kv_cache_config, self.vllm_config, self.device
        )
        self.reorder_batch_threshold = reorder_batch_threshold(self.attn_groups)
        self.kv_caches = kv_cache_setup.allocate_and_bind_kv_caches(
            kv_cache_config, self.attn_groups, self.vllm_config, self.device
        )
        self.cudagraph_manager.initialize(
            resolve_cudagraph_mode(self.vllm_config, self.attn_groups)
        )
        self.model = self.cudagraph_manager.wrap_model(self.model)

    # ---- dummy runs (gpu_dummy_run.py) and graph capture (cudagraph_manager.py) ----
    def _dummy_run(
        self,
        num_tokens: int,
        use_kv_cache: bool = True,
        num_reqs: int | None = None,
        cudagraph_runtime_mode: CUDAGraphMode | None = None,
        uniform_decode: bool = False,
    ) -> torch.Tensor:
        assert self.model is not None, "load_model() has not run"
        return dummy_run(
            self.vllm_config,
            self.model,
            self.input_buffers,
            self.input_batch,
            self.attn_groups if use_kv_cache else [],
            self.cudagraph_manager.dispatcher,
            num_tokens,
            num_reqs,
            cudagraph_runtime_mode,
            uniform_decode,
            self._dummy_lora_hook(),
        )

    def _dummy_lora_hook(self) -> Callable[[np.ndarray], None] | None:
        """With LoRA: maps a dummy batch (these request sizes) to no adapter."""
        return self.set_dummy_loras if self.lora_config is not None else None

    def get_supported_tasks(self) -> tuple[str, ...]:
        if self.is_pooling_model:
            return supported_pooling_tasks(unwrap_model(self.model))
        return ("generate",)

    def _dummy_sampler_run(self, hidden_states: torch.Tensor) -> None:
        if self.is_pooling_model:
            dummy_pooler_run(unwrap_model(self.model), self.model_config, hidden_states)
            return
        dummy_sampler_run(
            self.model_config, unwrap_model(self.model), self.sampler, hidden_states, self.device
        )

    def profile_run(self) -> None:
        """The largest step the scheduler can produce, without a KV cache: its
        peak memory is what the KV cache must leave room for."""
        self._dummy_sampler_run(self._dummy_run(self.max_num_tokens, use_kv_cache=False))

    def capture_model(self) -> int:
        """Capture every graph the dispatcher has a key for, largest first
        (called by the worker after warm-up); returns how many."""
        return self.cudagraph_manager.capture(
            self.model,
            self.input_buffers,
            self.input_batch,
            self.attn_groups,
            self._dummy_lora_hook(),
        )

    # ---- one step ------------------------------------------------------------
    @torch.inference_mode()
    def execute_model(
        self,
        scheduler_output: SchedulerOutput,
        intermediate_tensors: IntermediateTensors | None = None,
    ) -> ModelRunnerOutput | IntermediateTensors | None:
        """Run the forward pass; returns None and leaves the logits for
        `sample_tokens` (or EMPTY_MODEL_RUNNER_OUTPUT when nothing is scheduled).
        Under pipeline parallelism a later stage starts from the previous
        stage's `intermediate_tensors`, and a stage before the last returns
        its own for the next stage."""
        if self.execute_model_state is not None:
            raise RuntimeError("execute_model() called twice without sample_tokens().")
        if self.prepare_inputs_event is not None:
            self.prepare_inputs_event.synchronize()
        self._update_states(scheduler_output)
        if not scheduler_output.total_num_scheduled_tokens:
            if self.async_sampled_tokens is not None:
                self.async_sampled_tokens.clear()  # nothing sampled, nothing in flight
            return EMPTY_MODEL_RUNNER_OUTPUT

        prepared = self._prepare_inputs(scheduler_output)
        if self.prepare_inputs_event is not None:
            self.prepare_inputs_event.record()
        hidden_states, aux_hidden_states = self._model_forward(
            scheduler_output, prepared, intermediate_tensors
        )
        if not get_pp_group().is_last_rank:
            self.execute_model_state = ExecuteModelState(
                scheduler_output, None, None, prepared.discard_mask
            )
            return hidden_states  # IntermediateTensors for the next stage
        if self.is_pooling_model:
            return self._pool(scheduler_output, hidden_states)
        logits = unwrap_model(self.model).compute_logits(hidden_states[prepared.logits_indices])
        self.execute_model_state = ExecuteModelState(
            scheduler_output,
            hidden_states,
            logits,
            prepared.discard_mask,
            prepared.spec_step,
            aux_hidden_states,
        )
        return None

    def _model_forward(
        self,
        scheduler_output: SchedulerOutput,
        prepared: PreparedInputs,
        intermediate_tensors: IntermediateTensors | None,
    ) -> tuple[Any, list[torch.Tensor] | None]:
        """The forward over the padded inputs (a graph replay under FULL):
        ([num_tokens, hidden] hidden states without the padding, or the
        IntermediateTensors of a stage before the last; the EAGLE3 target
        layers' outputs or None)."""
        padded = prepared.padded
        num_tokens = padded.num_tokens_padded
        with set_forward_context(
            prepared.attn_metadata,
            self.vllm_config,
            num_tokens=num_tokens,
            cudagraph_runtime_mode=padded.runtime_mode,
            batch_descriptor=padded.batch_descriptor,
        ):
            assert self.model is not None, "load_model() has not run"
            output = self.model(
                input_ids=self.input_buffers.input_ids.gpu[:num_tokens],
                positions=self.input_buffers.positions.gpu[:num_tokens],
                intermediate_tensors=intermediate_tensors,
                **self._extra_model_inputs(scheduler_output),
            )
        hidden_states, aux_hidden_states = split_model_output(output, padded.num_tokens)
        if padded.num_tokens != num_tokens and isinstance(hidden_states, torch.Tensor):
            hidden_states = hidden_states[: padded.num_tokens]  # drop the padding
        return hidden_states, aux_hidden_states

    def _pool(
        self, scheduler_output: SchedulerOutput, hidden_states: torch.Tensor
    ) -> ModelRunnerOutput:
        """A pooling model's step: the pooler's outputs (gpu_pooling.py)."""
        return pool_step(
            unwrap_model(self.model),
            hidden_states,
            list(self.input_batch.req_ids),
            self.requests,
            self.pooling_states,
            scheduler_output.num_scheduled_tokens,
            self.input_buffers.seq_lens.np,
        )

    def _extra_model_inputs(self, scheduler_output: SchedulerOutput) -> dict[str, torch.Tensor]:
        """Model inputs beyond ids and positions: a cross-encoder's
        token_type_ids when it scores pairs (pooling models only)."""
        if not self.is_pooling_model:
            return {}
        token_type_ids = token_type_ids_for_step(
            list(self.input_batch.req_ids),
            self.requests,
            scheduler_output.num_scheduled_tokens,
            self.input_buffers.positions.np,
            self.device,
        )
        return {} if token_type_ids is None else {"token_type_ids": token_type_ids}

    @torch.inference_mode()
    def sample_tokens(
        self, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | AsyncGPUModelRunnerOutput | None:
        """Sample from the logits of the preceding `execute_model`, masked by
        the step's grammar bitmask first (penalties, temperature and top-k/p
        come after and cannot revive a masked token)."""
        state = self.execute_model_state
        if state is None:
            return None
        self.execute_model_state = None
        if grammar_output is not None and state.logits is not None:
            # Rows in batch order, one per request (with drafts: its draft
            # rows, then its bonus row).
            apply_grammar_bitmask(
                state.scheduler_output, grammar_output, self.input_batch, state.logits
            )
        if state.logits is None:
            self._receive_last_stage_tokens(state.discard_mask)
            return None
        if state.spec_step is not None and state.spec_step.metadata is not None:
            # The step verified drafts: the rejection sampler's tokens go into the batch.
            assert self.spec_decoder is not None
            output = self.spec_decoder.verify(
                self.input_batch, state.spec_step.metadata, state.logits, state.discard_mask
            )
            output.prompt_logprobs_dict = self._prompt_logprobs(state)
        else:
            sampler_output = self._sample(state.logits, state.discard_mask)
            prompt_logprobs_dict = self._prompt_logprobs(state)
            if self.async_sampled_tokens is not None:
                return self.async_sampled_tokens.record(
                    self.input_batch,
                    sampler_output.sampled_token_ids,
                    sampler_output.logprobs_tensors,
                    state.discard_mask,
                    prompt_logprobs_dict,
                )
            output = self._bookkeeping_sync(
                sampler_output.sampled_token_ids,
                sampler_output.logprobs_tensors,
                state.discard_mask,
            )
            output.prompt_logprobs_dict = prompt_logprobs_dict
        # The next step's drafts, from the batch as it now stands.
        propose_drafts(
            self.spec_decoder, self.input_batch, state, output.sampled_token_ids, self.attn_groups
        )
        if self.async_spec_drafts is not None and state.spec_step is not None:
            self._keep_async_spec_state(state.spec_step, output.sampled_token_ids)
        return output

    def _keep_async_spec_state(self, spec_step: SpecStep, sampled: list[list[int]]) -> None:
        """Async scheduling with drafts: the step's rejections and the new
        drafts stay here for the next step's inputs (the scheduler gets
        placeholders; upstream keeps them on the device likewise)."""
        assert self.async_spec_drafts is not None and self.spec_decoder is not None
        self.async_spec_drafts.record_step(
            list(self.input_batch.req_ids),
            spec_step,
            sampled,
            self.spec_decoder.take_draft_token_ids(),
            self.spec_decoder.num_spec_tokens,
        )

    def _receive_last_stage_tokens(self, discard_mask: np.ndarray) -> None:
        """A pipeline stage before the last: take the last stage's tokens
        ([num_reqs, 1], broadcast by `sample_step`), so this stage's batch
        holds them too."""
        pp_group = get_pp_group()
        sampled = torch.empty((len(discard_mask), 1), dtype=torch.int64)
        self._bookkeeping_sync(
            pp_group.broadcast(sampled, src=pp_group.world_size - 1), None, discard_mask
        )

    def _prompt_logprobs(self, state: ExecuteModelState) -> dict[str, LogprobsTensors | None]:
        assert state.hidden_states is not None
        return self.prompt_logprobs_worker.compute_prompt_logprobs(
            unwrap_model(self.model).compute_logits,
            state.hidden_states,
            self.input_batch,
            self.input_buffers.query_start_loc.np,
            state.scheduler_output.num_scheduled_tokens,
            self._lora_logits_rows_hook(),
        )

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts the last step proposed (once; None without a drafter).
        Async scheduling: every request's kept drafts (the ones its next step
        verifies), which stay here."""
        if self.async_spec_drafts is not None:
            return self.async_spec_drafts.draft_token_ids()
        if self.spec_decoder is None:
            return None
        return self.spec_decoder.take_draft_token_ids()

    def _sample(self, logits: torch.Tensor, discard_mask: np.ndarray) -> SamplerOutput:
        """The sampler over the step's logits (gpu_sample_step.py)."""
        return sample_step(
            self.sampler, self.input_batch, self.async_sampled_tokens, logits, discard_mask
        )

    def _lora_logits_rows_hook(self) -> Callable[[int, int], None] | None:
        """With LoRA: before prompt logprobs compute `n` logits rows of batch
        row `row`, key those rows to the row's adapter."""
        if self.lora_config is None:
            return None
        lora_ids = self.input_batch.request_lora_mapping

        def hook(row: int, n: int) -> None:
            self.set_lora_logits_rows(np.full(n, lora_ids[row], dtype=np.int64))

        return hook

    def _bookkeeping_sync(
        self,
        sampled_token_ids: torch.Tensor,
        logprobs_tensors: LogprobsTensors | None,
        discard_mask: np.ndarray,
    ) -> ModelRunnerOutput:
        """Append the sampled tokens to the batch; the step's output
        (gpu_sample_step.py)."""
        return bookkeeping_sync(self.input_batch, sampled_token_ids, logprobs_tensors, discard_mask)

    # ---- state updates (gpu_state_updates.py) --------------------------------
    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        """Bring the cached request states and the persistent batch in line
        with the scheduler's decisions for this step."""
        batch, async_spec = self.input_batch, self.async_spec_drafts
        remove_stale_requests(
            scheduler_output,
            batch,
            self.requests,
            self.pooling_states,
            self.prompt_logprobs_worker,
        )
        reqs_to_add = [self._add_new_request(r) for r in scheduler_output.scheduled_new_reqs]
        reqs_to_add += update_cached_requests(
            scheduler_output,
            batch,
            self.requests,
            self.pooling_states,
            async_spec.corrected_num_computed if async_spec is not None else None,
        )
        for req_state in reqs_to_add:
            batch.add_request(req_state)
            if self.async_sampled_tokens is not None:
                self.async_sampled_tokens.forget(req_state.req_id)  # re-sent whole
        batch.condense()
        if self.reorder_batch_threshold is not None:
            reorder_batch_to_split_decodes_and_prefills(
                batch, scheduler_output.num_scheduled_tokens, self.reorder_batch_threshold
            )
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        if async_spec is not None:
            for req_id in scheduler_output.finished_req_ids:
                async_spec.remove(req_id)
            spec_tokens = async_spec.real_spec_tokens(spec_tokens)  # placeholders -> drafts
        if spec_tokens:
            write_draft_tokens(batch, spec_tokens)
        batch.refresh_metadata()

    def _add_new_request(self, new_req: NewRequestData) -> CachedRequestState:
        if new_req.pooling_params is not None:
            return add_new_pooling_request(
                new_req, self.requests, self.pooling_states, self.is_pooling_model
            )
        return add_new_request(new_req, self.requests, self.prompt_logprobs_worker, self.device)

    # ---- inputs (gpu_step_inputs.py) -----------------------------------------
    def _prepare_inputs(self, scheduler_output: SchedulerOutput) -> PreparedInputs:
        """The step's inputs on the device with their attention metadata: the
        host buffers filled (`fill_step_inputs`), the drafts and LoRA mappings,
        the graph and the padding to its size (dummy requests, see
        vllm/v1/worker/cudagraph_padding.py), then the copy to the device."""
        batch, bufs = self.input_batch, self.input_buffers
        layout = fill_step_inputs(
            scheduler_output, batch, bufs, self.arange_np, self.max_num_tokens
        )
        spec_step, has_lora = spec_step_and_loras(
            scheduler_output,
            batch,
            layout,
            bufs.input_ids.np[: layout.total],
            self.spec_decoder,
            self.set_active_loras if self.lora_config is not None else None,
        )
        padded = self.cudagraph_manager.dispatch(layout.num_scheduled, layout.total, has_lora)
        attn_metadata = bufs.commit(padded, batch, self.attn_groups)
        if self.async_sampled_tokens is not None:
            # The decode tokens sampled by the step still in flight.
            self.async_sampled_tokens.scatter_into_input_ids(
                batch.req_ids, bufs.input_ids.np, bufs.input_ids.gpu, layout.cu_num_tokens
            )
        spec_metadata = spec_step.metadata if spec_step is not None else None
        logits_indices = logits_indices_for_step(bufs, batch.num_reqs, spec_metadata)
        discard_mask = discard_mask_for_step(batch, bufs)
        return PreparedInputs(attn_metadata, logits_indices, discard_mask, padded, spec_step)
