"""The worker: one device, one model runner (upstream: vllm/v1/worker/gpu_worker.py).

Runs on the device `vllm_config.device_config` names, CPU or CUDA. The KV
cache budget comes from a memory profile on CUDA and from configuration on
CPU, where the "device" memory is the host's and profiling it says nothing
useful about what the rest of the machine needs.

`_make_model_runner` builds Model Runner V2 (`vllm/v1/worker/gpu/`) when
`VllmConfig.use_v2_model_runner` says so, else the V1 runner
(`gpu_model_runner.py`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import os
import time
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from vllm import envs
from vllm.distributed import get_pp_group
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.sequence import IntermediateTensors
from vllm.utils import GiB_bytes
from vllm.v1.worker import worker_sleep
from vllm.v1.worker.utils import get_model_config
from vllm.v1.worker.worker_base import WorkerBase

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.lora.request import LoRARequest
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
    from vllm.v1.outputs import AsyncModelRunnerOutput, DraftTokenIds, ModelRunnerOutput
    from vllm.v1.worker.runner_interface import ModelRunner

logger = init_logger(__name__)

# KV cache size on CPU when neither cache_config.kv_cache_memory_bytes nor
# VLLM_CPU_KVCACHE_SPACE is set (upstream's CPU default is also 4 GiB).
DEFAULT_CPU_KV_CACHE_BYTES = 4 * GiB_bytes


class Worker(WorkerBase):
    """A worker on one CPU or CUDA device."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int = 0,
        rank: int = 0,
        distributed_init_method: str = "",
        is_driver_worker: bool = True,
    ) -> None:
        super().__init__(vllm_config, local_rank, rank, distributed_init_method, is_driver_worker)
        self.device: torch.device | None = None
        self.model_runner: ModelRunner | None = None
        # CUDA: (free, total) bytes right after device init, before the model.
        self._init_mem_snapshot: tuple[int, int] | None = None
        self._weights_memory = 0
        # Sleep mode (worker_sleep.py): the tags asleep, the level they went
        # to sleep at, and weights moved to host memory by level 1.
        self._sleeping_tags: set[str] = set()
        self._sleep_level = 0
        self._host_weights: dict[tuple[str, str], torch.Tensor] | None = None

    # ---- set-up ----------------------------------------------------------------
    def init_device(self) -> None:
        if self.device_config.device_type == "cuda":
            self.device = torch.device(f"cuda:{self.local_rank}")
            torch.cuda.set_device(self.device)
            torch.cuda.empty_cache()
            self._init_mem_snapshot = torch.cuda.mem_get_info()
        else:
            self.device = torch.device("cpu")
            self._init_cpu_threads()
        init_worker_distributed_environment(
            self.vllm_config,
            self.rank,
            self.distributed_init_method,
            self.local_rank,
            "nccl" if self.device.type == "cuda" else "gloo",
        )
        current_platform.seed_everything(get_model_config(self.vllm_config).seed)
        # Capture sizes clipped to what one step can hold (upstream does this
        # when it builds VllmConfig).
        sched = self.vllm_config.scheduler_config
        self.vllm_config.compilation_config.set_cudagraph_sizes(
            sched.max_num_batched_tokens, sched.max_num_seqs
        )
        self.model_runner = self._make_model_runner()

    def _init_cpu_threads(self) -> None:
        """One intra-op thread per usable core, unless OMP_NUM_THREADS says
        otherwise. (Measured on 2 cores: 2 threads halve a prefill-sized GEMM
        and help decode-sized ones; torch's default already agrees there.)"""
        if os.environ.get("OMP_NUM_THREADS"):
            # Set, not only read: a forked worker's torch may have sized its
            # pool from the parent's environment before the executor set this.
            with contextlib.suppress(ValueError):
                torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
            logger.info("CPU worker: %d torch threads (OMP_NUM_THREADS)", torch.get_num_threads())
            return
        cores = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else (os.cpu_count() or 1)
        )
        if torch.get_num_threads() != cores:
            torch.set_num_threads(cores)
        logger.info(
            "CPU worker: %d torch threads for %d usable cores", torch.get_num_threads(), cores
        )

    def _make_model_runner(self) -> ModelRunner:
        """Model Runner V2 when the config picks it, else the V1 runner."""
        assert self.device is not None
        if self.vllm_config.use_v2_model_runner:
            from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2ModelRunner

            return V2ModelRunner(self.vllm_config, self.device)
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        if self.vllm_config._is_default_v2_model_runner_model():
            if importlib.util.find_spec("vllm.v1.worker.gpu.model_runner") is None:
                reason = "Model Runner V2, this model's default, is not built yet"
            else:
                reason = "Model Runner V2 is disabled for this configuration"
            logger.info_once("Using the V1 model runner: %s.", reason)
        return GPUModelRunner(self.vllm_config, self.device)

    def load_model(self) -> None:
        self._runner().load_model()
        if self.parallel_config.pipeline_parallel_size > 1:
            from vllm.model_executor.models.interfaces import supports_pp

            if not supports_pp(self.get_model()):
                raise ValueError(
                    f"{type(self.get_model()).__name__} does not support pipeline parallelism."
                )
        if self.device is not None and self.device.type == "cuda":
            self._weights_memory = torch.cuda.memory_allocated(self.device)

    def get_model(self) -> nn.Module:
        return self._runner().get_model()

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return self._runner().get_kv_cache_spec()

    def get_supported_tasks(self) -> tuple[str, ...]:
        """("generate",), or a pooling model's tasks (its pooler's)."""
        runner_tasks = getattr(self._runner(), "get_supported_tasks", None)
        return runner_tasks() if runner_tasks is not None else ("generate",)

    # ---- memory ---------------------------------------------------------------
    @torch.inference_mode()
    def determine_available_memory(self) -> int:
        """Bytes for the KV cache.

        CPU: `cache_config.kv_cache_memory_bytes`, else VLLM_CPU_KVCACHE_SPACE
        GiB, else 4 GiB capped at what max_num_seqs full-length requests
        can use. CUDA: `kv_cache_memory_bytes` if set, else profile the
        largest step and return total * gpu_memory_utilization minus what is not
        KV cache (weights, peak activations, memory outside torch's allocator).
        """
        explicit = self.cache_config.kv_cache_memory_bytes
        if self.device is None or self.device.type != "cuda":
            if explicit is not None:
                source, size = "kv_cache_memory_bytes", explicit
            elif envs.VLLM_CPU_KVCACHE_SPACE is not None:
                source, size = "VLLM_CPU_KVCACHE_SPACE", envs.VLLM_CPU_KVCACHE_SPACE * GiB_bytes
            else:
                source, size = "default", self._default_cpu_kv_cache_bytes()
            logger.info("CPU KV cache space: %.2f GiB (%s)", size / GiB_bytes, source)
            return int(size)
        if explicit is not None:
            logger.info("KV cache memory: %.2f GiB (kv_cache_memory_bytes)", explicit / GiB_bytes)
            return int(explicit)
        return self._profile_cuda_memory()

    def _default_cpu_kv_cache_bytes(self) -> int:
        """Upstream's 4 GiB CPU default, capped at what the scheduler can ever
        use: max_num_seqs requests of max_model_len tokens each. A small model
        then allocates (and zero-fills) megabytes, not gigabytes, so start-up
        stays fast; an explicit size is never capped."""
        specs = self.get_kv_cache_spec().values()
        per_request = sum(spec.max_memory_usage_bytes(self.vllm_config) for spec in specs)
        usable = per_request * self.vllm_config.scheduler_config.max_num_seqs
        if not usable:
            return DEFAULT_CPU_KV_CACHE_BYTES
        return int(min(DEFAULT_CPU_KV_CACHE_BYTES, usable))

    def _profile_cuda_memory(self) -> int:
        assert self._init_mem_snapshot is not None
        init_free, total = self._init_mem_snapshot
        requested = total * self.cache_config.gpu_memory_utilization
        if init_free < requested:
            raise ValueError(
                f"Free memory on device ({init_free / GiB_bytes:.2f}/{total / GiB_bytes:.2f} "
                f"GiB) at start-up is less than the desired GPU memory utilization "
                f"({self.cache_config.gpu_memory_utilization}, "
                f"{requested / GiB_bytes:.2f} GiB). Lower gpu_memory_utilization."
            )
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        self._runner().profile_run()
        torch.cuda.synchronize(self.device)
        peak_activation = torch.cuda.max_memory_allocated(self.device) - before
        free, _ = torch.cuda.mem_get_info()
        # Memory this process uses outside torch's allocator (CUDA context,
        # libraries), relative to the start-up snapshot.
        non_torch = max((init_free - free) - torch.cuda.memory_reserved(self.device), 0)
        non_kv = self._weights_memory + peak_activation + non_torch
        # gpu_memory_utilization is this instance's share of the device, so
        # memory other processes held at start-up is not subtracted.
        available = int(requested - non_kv)
        logger.info(
            "Memory profile: weights %.2f GiB, peak activations %.2f GiB, non-torch "
            "%.2f GiB -> KV cache %.2f GiB",
            self._weights_memory / GiB_bytes,
            peak_activation / GiB_bytes,
            non_torch / GiB_bytes,
            available / GiB_bytes,
        )
        torch.cuda.empty_cache()
        return max(available, 0)

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        self._runner().initialize_kv_cache(kv_cache_config)

    def compile_or_warm_up_model(self) -> None:
        """Run a decode-shaped and a prefill-shaped step once so first-call
        costs (kernel selection, allocations) are paid before serving, capture
        the CUDA graphs (when the resolved cudagraph_mode has any), then
        re-seed so the warm-up does not shift the RNG streams."""
        runner = self._runner()
        max_tokens = runner.max_num_tokens
        # On CPU only first-call costs are worth paying here (thread pool,
        # kernel JIT, lazy imports on the sampling path): there is no graph to
        # capture, and a full-size step (256 rows x the vocabulary in the
        # sampler) costs seconds of start-up for nothing. 8 rows and a 32-token
        # prefill touch the same code paths.
        on_cpu = self.device is None or self.device.type == "cpu"
        decode_rows = min(runner.max_num_reqs, max_tokens, 8 if on_cpu else max_tokens)
        runner._dummy_sampler_run(runner._dummy_run(decode_rows))
        prefill_tokens = min(32 if on_cpu else 256, max_tokens, runner.max_model_len)
        runner._dummy_run(prefill_tokens, num_reqs=1)
        self._capture_cudagraphs(runner)
        current_platform.seed_everything(get_model_config(self.vllm_config).seed)

    def _capture_cudagraphs(self, runner: ModelRunner) -> None:
        if self.device is None or self.device.type != "cuda":
            return
        free_before = torch.cuda.mem_get_info()[0]
        start = time.perf_counter()
        num_graphs = runner.capture_model()
        if num_graphs:
            logger.info(
                "Captured %d CUDA graphs in %.1f s, %.2f GiB",
                num_graphs,
                time.perf_counter() - start,
                (free_before - torch.cuda.mem_get_info()[0]) / GiB_bytes,
            )

    # ---- steps -----------------------------------------------------------------
    @torch.inference_mode()
    def execute_dummy_batch(self) -> None:
        """One forward pass of a one-token dummy batch (upstream:
        Worker.execute_dummy_batch): an idle data-parallel MoE engine's part
        of the MoE collectives of a step the other engines run."""
        self._runner()._dummy_run(1, num_reqs=1)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        """One forward pass. A pipeline stage after the first receives the
        previous stage's tensors first; one before the last sends its own on
        and returns None (only the last stage has an output)."""
        pp_group = get_pp_group()
        intermediate_tensors = None
        if not pp_group.is_first_rank and scheduler_output.total_num_scheduled_tokens > 0:
            assert self.device is not None  # init_device has run
            intermediate_tensors = IntermediateTensors(
                pp_group.recv_tensor_dict(device=self.device)
            )
        output = self._runner().execute_model(scheduler_output, intermediate_tensors)
        if isinstance(output, IntermediateTensors):
            pp_group.send_tensor_dict(output.tensors)
            return None
        return output

    def sample_tokens(
        self, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | AsyncModelRunnerOutput | None:
        return self._runner().sample_tokens(grammar_output)

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts the runner proposed in its last step (speculative
        decoding), handed over once; None when it proposed none."""
        return self._runner().take_draft_token_ids()

    # ---- LoRA adapters (lora_model_runner_mixin.py; RuntimeError without --enable-lora) ----
    def add_lora(self, lora_request: LoRARequest) -> bool:
        return self._runner().add_lora(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self._runner().remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        return self._runner().list_loras()

    def pin_lora(self, lora_id: int) -> bool:
        return self._runner().pin_lora(lora_id)

    def check_health(self) -> None:
        if self.model_runner is None:
            raise RuntimeError("Worker is not initialised (init_device has not run).")

    def shutdown(self) -> None:
        """Drop the KV cache tensors so their memory can be reused in-process."""
        if self.model_runner is not None:
            worker_sleep.discard_kv_cache(self.model_runner, self.vllm_config)

    # ---- sleep mode (upstream: Worker.sleep / wake_up; see worker_sleep.py) ------------
    def sleep(self, level: int = 1) -> None:
        """Level 1: discard the KV cache (and move the weights to host memory
        on an accelerator); level 2: discard the weights too."""
        if level not in (1, 2):
            raise ValueError(f"Worker sleep level must be 1 or 2, got {level!r}.")
        worker_sleep.check_sleep_supported(self.vllm_config, level)
        runner = self._runner()
        before = _memory_in_use(self.device)
        if "kv_cache" not in self._sleeping_tags:
            worker_sleep.discard_kv_cache(runner, self.vllm_config)
        if "weights" not in self._sleeping_tags:
            self._sleep_level = level
            if level == 2:
                worker_sleep.discard_weights(runner.get_model())
            elif self.device is not None and self.device.type != "cpu":
                self._host_weights = worker_sleep.offload_weights(runner.get_model())
        self._sleeping_tags = set(worker_sleep.SLEEP_TAGS)
        gc.collect()
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.empty_cache()
        after = _memory_in_use(self.device)
        logger.info(
            "Sleep level %d: %.2f GiB freed (%.2f GiB still in use).",
            level,
            (before - after) / GiB_bytes,
            after / GiB_bytes,
        )

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Take back the memory of `tags` ("weights", "kv_cache"; None: both)."""
        worker_sleep.check_wake_up_tags(tags)
        tags = list(worker_sleep.SLEEP_TAGS) if tags is None else tags
        runner = self._runner()
        if "weights" in tags and "weights" in self._sleeping_tags:
            if self._sleep_level == 2:
                worker_sleep.reload_weights(runner.get_model(), self.vllm_config)
            elif self._host_weights is not None:
                assert self.device is not None
                worker_sleep.onload_weights(runner.get_model(), self._host_weights, self.device)
                self._host_weights = None
            self._sleeping_tags.discard("weights")
        if "kv_cache" in tags and "kv_cache" in self._sleeping_tags:
            worker_sleep.reallocate_kv_cache(runner, self.vllm_config)
            self._sleeping_tags.discard("kv_cache")

    def _runner(self) -> ModelRunner:
        if self.model_runner is None:
            raise RuntimeError("init_device() must run before this worker call.")
        return self.model_runner


def _memory_in_use(device: torch.device | None) -> int:
    """Bytes this process holds on `device`: allocated device memory on
    CUDA, the resident set on CPU."""
    if device is not None and device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    import psutil

    return psutil.Process().memory_info().rss


def init_worker_distributed_environment(
    vllm_config: VllmConfig,
    rank: int,
    distributed_init_method: str | None = None,
    local_rank: int = -1,
    backend: str = "gloo",
) -> None:
    """Join the workers' torch.distributed world and build the tensor-,
    pipeline-, data- and expert-parallel groups. One worker (world size 1)
    needs no process group: `vllm.distributed`'s one-rank groups serve it.

    With data_parallel_size > 1 (only MoE models keep it: a dense model's DP
    engines are reconfigured to DP=1) the workers of all DP engines join one
    world of `world_size_across_dp` ranks, rank dp_rank * world_size + rank,
    at data_parallel_master_ip and the next DP init port (every engine got
    the same port list from the front end), as upstream."""
    parallel_config = vllm_config.parallel_config
    world_size = parallel_config.world_size
    if parallel_config.data_parallel_size > 1:
        rank = parallel_config.data_parallel_rank * world_size + rank
        world_size = parallel_config.world_size_across_dp
        distributed_init_method = (
            f"tcp://{parallel_config.data_parallel_master_ip}:"
            f"{parallel_config.get_next_dp_init_port()}"
        )
    if world_size == 1:
        return
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    init_distributed_environment(
        world_size, rank, distributed_init_method or "env://", local_rank, backend
    )
    ensure_model_parallel_initialized(
        parallel_config.tensor_parallel_size, parallel_config.pipeline_parallel_size, backend
    )
