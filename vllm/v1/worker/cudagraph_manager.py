"""CUDA graphs of the V1 model runner (upstream: `_check_and_update_cudagraph_mode`,
`capture_model` and the dispatch in `_prepare_inputs` of
vllm/v1/worker/gpu_model_runner.py).

`CudaGraphManager` is the part `GPUModelRunner` owns in the role of V2's
`CudaGraphManager` (vllm/v1/worker/gpu/cudagraph_utils.py): it owns the
`CudagraphDispatcher` (the graph keys), picks each step's graph and padding
(`dispatch`), and captures the graphs (`capture`, through its own dummy runs,
vllm/v1/worker/gpu_dummy_run.py). Unlike V2 it does not hold the graphs: under
FULL the model is wrapped in a `CUDAGraphWrapper` (`wrap_model`), which records
and replays them. Which class does what in both runners:
vllm/v1/cudagraph_dispatcher.py.

What the runner replaces after construction is passed per call (as V2's
`CudaGraphManager.capture` takes its model): the model (loaded, wrapped for
graphs, or a test's spy), the persistent batch and the attention groups (both
rebuilt by initialize_kv_cache).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
from vllm.v1.worker.cudagraph_padding import PaddedBatch, plan_padding
from vllm.v1.worker.gpu_dummy_run import dummy_run
from vllm.v1.worker.utils import get_model_config

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu_input_batch import InputBatch
    from vllm.v1.worker.gpu_input_buffers import InputBuffers
    from vllm.v1.worker.utils import AttentionGroup, TextGenerationModel


def unwrap_model(model: TextGenerationModel | None) -> TextGenerationModel:
    """The model itself, under the CUDAGraphWrapper full graphs put on it."""
    assert model is not None, "load_model() has not run"
    return model.unwrap() if isinstance(model, CUDAGraphWrapper) else model


class CudaGraphManager:
    """Graph keys, each step's graph and padding, the model's wrapper, capture."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        self.vllm_config = vllm_config
        self.device = device
        self.dispatcher = CudagraphDispatcher(vllm_config)
        self.cudagraph_mode = CUDAGraphMode.NONE
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.max_model_len = get_model_config(vllm_config).max_model_len

    def initialize(self, cudagraph_mode: CUDAGraphMode) -> None:
        """Keys for `cudagraph_mode`, already narrowed to what the attention
        backends allow (cudagraph_padding.resolve_cudagraph_mode)."""
        self.cudagraph_mode = cudagraph_mode
        self.dispatcher.initialize_cudagraph_keys(cudagraph_mode, uniform_decode_query_len=1)

    def wrap_model(self, model: TextGenerationModel | None) -> TextGenerationModel:
        """The model, wrapped in a CUDAGraphWrapper under FULL graphs."""
        if self.cudagraph_mode.has_full_cudagraphs() and not isinstance(model, CUDAGraphWrapper):
            return CUDAGraphWrapper(unwrap_model(model), self.vllm_config, CUDAGraphMode.FULL)
        assert model is not None, "load_model() has not run"
        return model

    def dispatch(
        self, num_scheduled: np.ndarray, num_tokens: int, has_lora: bool = False
    ) -> PaddedBatch:
        """The dispatcher's graph for a real batch and the padding it needs.
        Graphs are captured without adapters: a batch with some (`has_lora`)
        finds no key and runs eagerly."""
        num_reqs = len(num_scheduled)
        uniform_decode = bool((num_scheduled == 1).all())
        mode, desc = self.dispatcher.dispatch(
            num_tokens, uniform_decode=uniform_decode, has_lora=has_lora, num_reqs=num_reqs
        )
        return plan_padding(mode, desc, num_reqs, num_tokens, self.max_num_reqs, self.max_model_len)

    def capture(
        self,
        model: TextGenerationModel | None,
        buffers: InputBuffers,
        input_batch: InputBatch,
        attn_groups: list[list[AttentionGroup]],
        set_lora_mapping: Callable[[np.ndarray], None] | None = None,
    ) -> int:
        """Capture one graph per dispatcher key, largest first (smaller graphs
        reuse the memory pool the large ones grew), each after one eager dummy
        run of the same shape (Triton compiles and autotunes there, not inside
        the capture). With LoRA the LoRA layers are captured with no adapter
        active (`set_lora_mapping`, see gpu_dummy_run.dummy_run). Returns the
        number of graphs."""
        assert model is not None, "load_model() has not run"
        num_graphs = 0
        for mode, descs in self.dispatcher.get_capture_descs():
            for desc in descs:
                for run_mode in (None, mode):
                    dummy_run(
                        self.vllm_config,
                        model,
                        buffers,
                        input_batch,
                        attn_groups,
                        self.dispatcher,
                        desc.num_tokens,
                        cudagraph_runtime_mode=run_mode,
                        uniform_decode=desc.uniform,
                        set_lora_mapping=set_lora_mapping,
                    )
                num_graphs += 1
        if num_graphs and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return num_graphs
