"""The V1 model runner (upstream: vllm/v1/worker/gpu_model_runner.py).

Despite the name it is device-agnostic: on a CPU device the "device" buffers
are the host buffers themselves and no copies happen.

One step is two calls, as upstream:
  execute_model(scheduler_output) -> None
      _update_states   apply the scheduler's diffs to the persistent batch
      _prepare_inputs  token ids, positions, slots, query_start_loc (numpy);
                       the graph and the padding to its size
                       (CudaGraphManager.dispatch, vllm/v1/worker/cudagraph_manager.py),
                       the padded inputs on the device with their attention
                       metadata (InputBuffers.commit, vllm/v1/worker/gpu_input_buffers.py)
      forward (a CUDAGraphWrapper replay under FULL), logits of the last
      scheduled token of every request
  sample_tokens(grammar_output) -> ModelRunnerOutput
      the structured-output bitmask masks the logits (rows found by request
      id), sampler, then write the sampled tokens back into the persistent batch;
      with async scheduling an AsyncGPUModelRunnerOutput instead, and the
      tokens reach the next step's inputs on the device
      (AsyncSampledTokens, vllm/v1/worker/async_sampled_tokens.py)

Speculative decoding (sync scheduling only) is the SpeculativeDecoder of
vllm/v1/worker/spec_decode_utils.py: the scheduled drafts join the step's
inputs, the logits hold each drafting request's draft rows and bonus row,
the rejection sampler emits a variable number of tokens per request, and
the next drafts are proposed after the step's bookkeeping.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, cast

import numpy as np
import torch
import torch.nn as nn

from vllm.distributed import get_pp_group
from vllm.forward_context import set_forward_context
from vllm.logger import init_logger
from vllm.sampling_params import SamplingType
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
from vllm.v1.worker.cudagraph_manager import CudaGraphManager, unwrap_model
from vllm.v1.worker.cudagraph_padding import PaddedBatch, resolve_cudagraph_mode
from vllm.v1.worker.gpu_dummy_run import dummy_run, dummy_sampler_run
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch
from vllm.v1.worker.gpu_input_buffers import InputBuffers
from vllm.v1.worker.gpu_pooling import (
    dummy_pooler_run,
    pool_step,
    supported_pooling_tasks,
    token_type_ids_for_step,
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
    as_text_generation_model,
    get_model_config,
    reorder_batch_to_split_decodes_and_prefills,
    resolved_dtype,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.compilation import CUDAGraphMode
    from vllm.v1.core.sched.output import GrammarOutput, NewRequestData, SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

logger = init_logger(__name__)


class ExecuteModelState(NamedTuple):
    """What `execute_model` leaves for the `sample_tokens` call that follows."""

    scheduler_output: SchedulerOutput
    # [num_tokens, hidden] (for prompt logprobs); None on a pipeline stage
    # before the last, which has no logits either.
    hidden_states: torch.Tensor | None
    logits: torch.Tensor | None  # [num_reqs, vocab]
    # [num_reqs] bool: requests still mid-prefill, whose sampled token is dropped.
    discard_mask: np.ndarray
    # With a drafter: the step's drafts (logits then hold each drafting
    # request's draft rows and bonus row) and the EAGLE3 target layers' outputs.
    spec_step: SpecStep | None = None
    aux_hidden_states: list[torch.Tensor] | None = None


class PreparedInputs(NamedTuple):
    attn_metadata: dict[str, object]
    # [num_reqs], or [num_drafts + num_reqs] when the step verifies drafts
    logits_indices: torch.Tensor
    discard_mask: np.ndarray  # [num_reqs]
    padded: PaddedBatch  # graph mode and padded shape of the forward
    spec_step: SpecStep | None


class GPUModelRunner(LoRAModelRunnerMixin):
    """Owns the model, the KV cache tensors, the persistent batch and input
    buffers, the sampler, and its parts: a CudaGraphManager, a
    PromptLogprobsWorker and, with async scheduling, the AsyncSampledTokens.
    LoRA (lora_model_runner_mixin.py): the step's adapter mapping is set in
    `_prepare_inputs`, before every forward."""

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
        self.async_sampled_tokens = (
            AsyncSampledTokens(torch.cuda.Stream() if on_cuda else None)
            if self.use_async_scheduling
            else None
        )
        # Speculative decoding (V1 runner only; VllmConfig turns async
        # scheduling off with it): drafter, rejection sampler, pending drafts.
        self.spec_decoder = (
            SpeculativeDecoder(vllm_config, device, self)
            if vllm_config.speculative_config is not None
            else None
        )
        self.drafter = self.spec_decoder.drafter if self.spec_decoder is not None else None

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
        from vllm.compilation.decorators import maybe_compile_model
        from vllm.model_executor.model_loader import get_model

        logger.info("Loading model %s on %s", self.model_config.model, self.device)
        model = get_model(vllm_config=self.vllm_config)
        # The weights' bytes as loaded (quantized ones at their packed size).
        self.model_memory_usage: int = getattr(model, "model_weight_bytes", 0)
        if self.lora_config is not None:
            # LoRA layers go in before torch.compile and the graph wrapper.
            model = self.load_lora_model(model, self.vllm_config, self.device)
        # No-op unless compilation_config.mode asks for torch.compile (on
        # CPU it measured slower than eager: see vllm/compilation/decorators.py).
        model = maybe_compile_model(model, self.vllm_config.compilation_config, self.device)
        if self.is_pooling_model:
            supported_pooling_tasks(model)  # raises when the model has no pooler
            self.model = cast(TextGenerationModel, model)
        else:
            self.model = as_text_generation_model(model)
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
        block_sizes = [
            g.kv_cache_spec.block_size
            for g in kv_cache_config.kv_cache_groups
            if not kv_cache_setup.is_cacheless_group(g.kv_cache_spec)
        ]
        if block_sizes != [self.cache_config.block_size]:
            # One block table per group; rebuild the (still empty) batch.
            assert not self.requests, "KV cache re-initialised with live requests"
            self.input_batch = self._make_input_batch(block_sizes)
        self.attn_groups = kv_cache_setup.make_attn_groups(
            kv_cache_config, self.vllm_config, self.device
        )
        thresholds = [
            threshold
            for groups in self.attn_groups
            for g in groups
            if (threshold := g.metadata_builder.reorder_batch_threshold) is not None
        ]
        self.reorder_batch_threshold = min(thresholds) if thresholds else None
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

        attn_metadata, logits_indices, discard_mask, padded, spec_step = self._prepare_inputs(
            scheduler_output
        )
        if self.prepare_inputs_event is not None:
            self.prepare_inputs_event.record()
        num_tokens = padded.num_tokens_padded
        extra_inputs: dict[str, torch.Tensor] = {}
        if self.is_pooling_model:
            token_type_ids = token_type_ids_for_step(
                list(self.input_batch.req_ids),
                self.requests,
                scheduler_output.num_scheduled_tokens,
                self.input_buffers.positions.np,
                self.device,
            )
            if token_type_ids is not None:  # a cross-encoder scoring pairs
                extra_inputs["token_type_ids"] = token_type_ids
        with set_forward_context(
            attn_metadata,
            self.vllm_config,
            num_tokens=num_tokens,
            cudagraph_runtime_mode=padded.runtime_mode,
            batch_descriptor=padded.batch_descriptor,
        ):
            assert self.model is not None, "load_model() has not run"
            hidden_states = self.model(
                input_ids=self.input_buffers.input_ids.gpu[:num_tokens],
                positions=self.input_buffers.positions.gpu[:num_tokens],
                intermediate_tensors=intermediate_tensors,
                **extra_inputs,
            )
        hidden_states, aux_hidden_states = split_model_output(hidden_states, padded.num_tokens)
        if padded.num_tokens != num_tokens and isinstance(hidden_states, torch.Tensor):
            hidden_states = hidden_states[: padded.num_tokens]  # drop the padding
        if not get_pp_group().is_last_rank:
            self.execute_model_state = ExecuteModelState(scheduler_output, None, None, discard_mask)
            return hidden_states  # IntermediateTensors for the next stage
        if self.is_pooling_model:
            return pool_step(
                unwrap_model(self.model),
                hidden_states,
                list(self.input_batch.req_ids),
                self.requests,
                self.pooling_states,
                scheduler_output.num_scheduled_tokens,
                self.input_buffers.seq_lens.np,
            )
        logits = unwrap_model(self.model).compute_logits(hidden_states[logits_indices])
        self.execute_model_state = ExecuteModelState(
            scheduler_output, hidden_states, logits, discard_mask, spec_step, aux_hidden_states
        )
        return None

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
        pp_group = get_pp_group()
        if state.logits is None:
            # A stage before the last: take the last stage's tokens, so this
            # stage's batch holds them too.
            sampled = torch.empty((len(state.discard_mask), 1), dtype=torch.int64)
            self._bookkeeping_sync(
                pp_group.broadcast(sampled, src=pp_group.world_size - 1), None, state.discard_mask
            )
            return None
        batch = self.input_batch
        if state.spec_step is not None and state.spec_step.metadata is not None:
            return self._verify_drafts(state, state.spec_step.metadata, state.logits)
        sampler_output = self._sample(state.logits, state.discard_mask)
        prompt_logprobs_dict = self._prompt_logprobs(state)
        if self.async_sampled_tokens is not None:
            return self.async_sampled_tokens.record(
                batch,
                sampler_output.sampled_token_ids,
                sampler_output.logprobs_tensors,
                state.discard_mask,
                prompt_logprobs_dict,
            )
        output = self._bookkeeping_sync(
            sampler_output.sampled_token_ids, sampler_output.logprobs_tensors, state.discard_mask
        )
        output.prompt_logprobs_dict = prompt_logprobs_dict
        self._propose_drafts(state, output.sampled_token_ids)
        return output

    def _verify_drafts(
        self, state: ExecuteModelState, metadata: SpecDecodeMetadata, logits: torch.Tensor
    ) -> ModelRunnerOutput:
        """The step verified drafts: the rejection sampler's tokens go into
        the batch, then the next drafts are proposed."""
        assert self.spec_decoder is not None
        output = self.spec_decoder.verify(self.input_batch, metadata, logits, state.discard_mask)
        output.prompt_logprobs_dict = self._prompt_logprobs(state)
        self._propose_drafts(state, output.sampled_token_ids)
        return output

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

    def _propose_drafts(self, state: ExecuteModelState, sampled: list[list[int]]) -> None:
        """The next step's drafts, from the batch as it now stands."""
        if self.spec_decoder is None or state.spec_step is None:
            return
        assert state.hidden_states is not None
        self.spec_decoder.propose(
            self.input_batch,
            state.spec_step,
            sampled,
            state.hidden_states,
            state.aux_hidden_states,
            self.attn_groups,
        )

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts the last step proposed (once; None without a drafter)."""
        if self.spec_decoder is None:
            return None
        return self.spec_decoder.take_draft_token_ids()

    def _sample(self, logits: torch.Tensor, discard_mask: np.ndarray) -> SamplerOutput:
        """The sampler over the step's logits; the last pipeline stage sends
        the tokens to the earlier ones."""
        batch = self.input_batch
        sampling_metadata = batch.sampling_metadata_for_step(discard_mask)
        async_tokens = self.async_sampled_tokens
        if async_tokens is not None and (
            not sampling_metadata.no_penalties or sampling_metadata.bad_words_token_ids
        ):
            # Penalties and bad words read the output tokens.
            async_tokens.resolve_placeholders(batch.req_ids, batch.req_output_token_ids)
        sampler_output = self.sampler(logits, sampling_metadata)
        pp_group = get_pp_group()
        if pp_group.world_size > 1:
            pp_group.broadcast(
                sampler_output.sampled_token_ids.to(torch.int64).cpu(), src=pp_group.world_size - 1
            )
        return sampler_output

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
        """Append the sampled tokens ([num_reqs, 1], waited for) to the
        persistent batch and build the step's output (with async scheduling
        `AsyncSampledTokens.record` does this instead)."""
        batch = self.input_batch
        sampled_np = sampled_token_ids[:, 0].cpu().numpy()
        rows = batch.append_sampled_tokens(sampled_np, discard_mask)
        sampled = sampled_np.tolist()
        sampled_token_ids_list: list[list[int]] = [[] for _ in sampled]
        for row in rows.tolist():
            sampled_token_ids_list[row] = [sampled[row]]
        return ModelRunnerOutput(
            req_ids=list(batch.req_ids),
            req_id_to_index=dict(batch.req_id_to_index),
            sampled_token_ids=sampled_token_ids_list,
            logprobs=logprobs_tensors.tolists() if logprobs_tensors is not None else None,
        )

    # ---- state updates -------------------------------------------------------
    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        """Bring the cached request states and the persistent batch in line
        with the scheduler's decisions for this step."""
        batch = self.input_batch
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
            self.pooling_states.pop(req_id, None)
            self.prompt_logprobs_worker.remove_request(req_id)
            batch.remove_request(req_id)

        # Requests in the batch but not scheduled now (preempted, or left out
        # this step) leave the batch; their CachedRequestState stays. A resumed
        # request is re-added below with its new block ids.
        cached = scheduler_output.scheduled_cached_reqs
        scheduled = scheduler_output.num_scheduled_tokens.keys()
        for req_id in list(batch.req_id_to_index):
            if req_id not in scheduled or req_id in cached.resumed_req_ids:
                batch.remove_request(req_id)

        reqs_to_add = [
            self._add_new_request(new_req) for new_req in scheduler_output.scheduled_new_reqs
        ]
        reqs_to_add += self._update_cached_requests(scheduler_output)
        for req_state in reqs_to_add:
            batch.add_request(req_state)
            if self.async_sampled_tokens is not None:
                self.async_sampled_tokens.forget(req_state.req_id)  # re-sent whole
        batch.condense()
        if self.reorder_batch_threshold is not None:
            reorder_batch_to_split_decodes_and_prefills(
                batch, scheduler_output.num_scheduled_tokens, self.reorder_batch_threshold
            )
        if scheduler_output.scheduled_spec_decode_tokens:
            write_draft_tokens(batch, scheduler_output.scheduled_spec_decode_tokens)
        batch.refresh_metadata()

    def _add_new_request(self, new_req: NewRequestData) -> CachedRequestState:
        if new_req.pooling_params is not None:
            return self._add_new_pooling_request(new_req)
        params = new_req.sampling_params
        if params is None:
            raise ValueError(f"Request {new_req.req_id} has neither sampling nor pooling params.")
        if new_req.prompt_token_ids is None:
            raise ValueError(
                f"Request {new_req.req_id} has no prompt token ids; prompt "
                "embeddings are not supported."
            )
        generator = None
        if params.sampling_type == SamplingType.RANDOM_SEED:
            generator = torch.Generator(device=self.device)
            assert params.seed is not None  # what makes it RANDOM_SEED
            generator.manual_seed(params.seed)
        req_state = CachedRequestState(
            req_id=new_req.req_id,
            prompt_token_ids=new_req.prompt_token_ids,
            mm_features=new_req.mm_features,
            sampling_params=params,
            generator=generator,
            block_ids=tuple(list(ids) for ids in new_req.block_ids),
            num_computed_tokens=new_req.num_computed_tokens,
            output_token_ids=[],
            lora_request=new_req.lora_request,
        )
        self.requests[new_req.req_id] = req_state
        self.prompt_logprobs_worker.add_request(new_req.req_id, new_req.prompt_token_ids, params)
        return req_state

    def _add_new_pooling_request(self, new_req: NewRequestData) -> CachedRequestState:
        if not self.is_pooling_model:
            raise ValueError(f"Request {new_req.req_id}: pooling params for a generative model.")
        if new_req.prompt_token_ids is None:
            raise ValueError(f"Request {new_req.req_id} has no prompt token ids.")
        req_state = CachedRequestState(
            req_id=new_req.req_id,
            prompt_token_ids=new_req.prompt_token_ids,
            mm_features=new_req.mm_features,
            sampling_params=None,
            generator=None,
            block_ids=tuple(list(ids) for ids in new_req.block_ids),
            num_computed_tokens=new_req.num_computed_tokens,
            output_token_ids=[],
            lora_request=new_req.lora_request,
            pooling_params=new_req.pooling_params,
        )
        self.requests[new_req.req_id] = req_state
        self.pooling_states[new_req.req_id] = PoolingStates()
        return req_state

    def _update_cached_requests(
        self, scheduler_output: SchedulerOutput
    ) -> list[CachedRequestState]:
        """Apply the per-request diffs; returns the states that must (re)join
        the batch (resumed, or not scheduled in the previous step)."""
        batch = self.input_batch
        data = scheduler_output.scheduled_cached_reqs
        to_add: list[CachedRequestState] = []
        for i, req_id in enumerate(data.req_ids):
            req_state = self.requests[req_id]
            num_computed = data.num_computed_tokens[i]
            new_block_ids = data.new_block_ids[i]
            req_state.num_computed_tokens = num_computed
            row = batch.req_id_to_index.get(req_id)

            num_output_tokens = data.num_output_tokens[i]
            if num_output_tokens < len(req_state.output_token_ids):
                # The scheduler dropped tokens we hold (e.g. a failed KV load).
                del req_state.output_token_ids[num_output_tokens:]
                if row is not None:
                    batch.num_tokens[row] = req_state.num_tokens

            if req_id in data.resumed_req_ids:
                assert row is None and new_block_ids is not None
                req_state.block_ids = tuple(list(ids) for ids in new_block_ids)
                if req_id in self.pooling_states:
                    # Preempted: its prompt is recomputed, so are the chunks kept.
                    self.pooling_states[req_id].clean()
            elif new_block_ids is not None:
                for block_ids, new_ids in zip(req_state.block_ids, new_block_ids):
                    block_ids.extend(new_ids)

            if row is None:
                all_token_ids = data.all_token_ids.get(req_id)
                if all_token_ids is not None:
                    req_state.output_token_ids[:] = all_token_ids[req_state.num_prompt_tokens :]
                to_add.append(req_state)
                continue
            batch.num_computed_tokens_cpu[row] = num_computed
            if new_block_ids is not None:
                batch.block_table.append_row(new_block_ids, row)
        return to_add

    # ---- inputs --------------------------------------------------------------
    def _prepare_inputs(self, scheduler_output: SchedulerOutput) -> PreparedInputs:
        """Fill the input buffers for the scheduled tokens, vectorised.

        Tokens are laid out request after request in batch order. For the
        example batch [req0: 3 tokens from position 5, req1: 1 token at 9]:
            req_indices = [0, 0, 0, 1]    positions = [5, 6, 7, 9]
            query_start_loc = [0, 3, 4]   seq_lens = [8, 10]
        When a CUDA graph serves the batch, dummy requests pad it to the
        graph's size (see vllm/v1/worker/cudagraph_padding.py).
        """
        batch, bufs = self.input_batch, self.input_buffers
        num_reqs = batch.num_reqs
        total = scheduler_output.total_num_scheduled_tokens
        assert 0 < total <= self.max_num_tokens
        num_scheduled = np.fromiter(
            (scheduler_output.num_scheduled_tokens[r] for r in batch.req_ids),
            dtype=np.int32,
            count=num_reqs,
        )
        cu_num_tokens = np.cumsum(num_scheduled)
        req_indices = np.repeat(self.arange_np[:num_reqs], num_scheduled)
        # Offset of each token inside its request: 0..n_i-1 for every request i.
        offsets = self.arange_np[:total] - np.repeat(cu_num_tokens - num_scheduled, num_scheduled)
        positions = bufs.positions.np[:total]
        np.add(batch.num_computed_tokens_cpu[req_indices], offsets, out=positions)

        # Token ids come from the flattened [max_num_reqs, max_model_len] buffer.
        token_indices = positions + req_indices * batch.token_ids_cpu.shape[1]
        np.take(batch.token_ids_cpu.ravel(), token_indices, out=bufs.input_ids.np[:total])
        batch.block_table.compute_slot_mapping(req_indices, positions)
        bufs.query_start_loc.np[0] = 0
        bufs.query_start_loc.np[1 : num_reqs + 1] = cu_num_tokens
        seq_lens = bufs.seq_lens.np[:num_reqs]
        np.add(batch.num_computed_tokens_cpu[:num_reqs], num_scheduled, out=seq_lens)

        spec_step, has_lora = self._spec_step_and_loras(
            scheduler_output, num_scheduled, cu_num_tokens, bufs.input_ids.np[:total]
        )
        spec_metadata = spec_step.metadata if spec_step is not None else None
        padded = self.cudagraph_manager.dispatch(num_scheduled, total, has_lora)
        attn_metadata = bufs.commit(padded, batch, self.attn_groups)
        if self.async_sampled_tokens is not None:
            # The decode tokens sampled by the step still in flight.
            self.async_sampled_tokens.scatter_into_input_ids(
                batch.req_ids, bufs.input_ids.np, bufs.input_ids.gpu, cu_num_tokens
            )
        if spec_metadata is not None:  # each drafting request's draft and bonus rows
            logits_indices = spec_metadata.logits_indices
        else:
            logits_indices = bufs.query_start_loc.gpu[1 : num_reqs + 1].to(torch.int64) - 1
        # A request whose tokens are not all computed after this step is still
        # in its prefill: the token sampled for it is not a real output.
        # (num_tokens counts no drafts: a row with drafts always samples.)
        discard_mask = seq_lens < batch.num_tokens[:num_reqs]
        return PreparedInputs(attn_metadata, logits_indices, discard_mask, padded, spec_step)

    def _spec_step_and_loras(
        self,
        scheduler_output: SchedulerOutput,
        num_scheduled: np.ndarray,
        cu_num_tokens: np.ndarray,
        input_ids: np.ndarray,
    ) -> tuple[SpecStep | None, bool]:
        """The step's drafts (with a drafter) and, with LoRA, the token ->
        adapter and logits row -> adapter mappings (a drafting request has
        its draft rows and its bonus row); whether any adapter is active."""
        spec_step = None
        if self.spec_decoder is not None:
            spec_step = self.spec_decoder.step_inputs(
                self.input_batch,
                scheduler_output.scheduled_spec_decode_tokens,
                num_scheduled,
                cu_num_tokens,
                input_ids,
            )
        if self.lora_config is None:
            return spec_step, False
        num_sampled = None
        if spec_step is not None and spec_step.metadata is not None:
            num_sampled = spec_step.num_draft_tokens + 1
        self.set_active_loras(self.input_batch, num_scheduled, num_sampled)
        return spec_step, bool(self.input_batch.lora_id_to_lora_request)
