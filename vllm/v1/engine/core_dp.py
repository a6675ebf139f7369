"""The engine core of one data-parallel rank of a mixture-of-experts model
(upstream: `DPEngineCoreProc` in vllm/v1/engine/core.py).

The MoE layers of all DP engines exchange tokens in every forward pass
(`vllm/distributed/device_communicators/all2all.py`), so the engines step in
lock-step: while any engine has requests, every engine runs one forward pass
per busy-loop iteration - a real batch, or a one-token dummy batch when it
has nothing scheduled. A period of such stepping is a "wave":

- an engine that gets a request while the engines are paused starts a wave:
  the front end asks the DP coordinator, which sends START_DP_WAVE (wave,
  engine to exclude) to the others; a request stamped with a finished wave
  makes the engine itself send `start_wave` to the coordinator (client
  index -1 on the output queue);
- every 32 steps the engines all-reduce "has unfinished requests" over a
  stateless gloo DP group (`ParallelConfig.stateless_init_dp_group`); when
  no engine has any, the wave ends on every engine at the same step, rank 0
  reports `wave_complete` to the coordinator, the wave number goes up and
  the step counter restarts.

Each engine runs exactly one forward pass per iteration (a dummy one when its
step launched none), so the forward passes - and their MoE collectives - of
all engines pair up, and all engines reach the all-reduce after the same
number of passes.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.config import ParallelConfig, VllmConfig
from vllm.logger import init_logger
from vllm.v1.engine import EngineCoreOutputs, EngineCoreRequestType
from vllm.v1.engine.core_proc import EngineCoreProc
from vllm.v1.metrics.stats import SchedulerStats
from vllm.v1.request import Request

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

    from vllm.v1.executor.abstract import Executor

logger = init_logger(__name__)

# The engines agree on whether any has unfinished requests every this many steps.
DP_SYNC_INTERVAL_STEPS = 32


class DPEngineCoreProc(EngineCoreProc):
    """`EngineCoreProc` stepping in lock-step with the other DP ranks."""

    # Keeps data_parallel_size (EngineCoreProc reconfigures a dense rank to DP=1).
    lockstep_dp: ClassVar[bool] = True

    def __init__(
        self,
        vllm_config: VllmConfig,
        local_client: bool,
        handshake_address: str,
        executor_class: type[Executor],
        log_stats: bool,
        client_handshake_address: str | None = None,
        engine_index: int = 0,
    ) -> None:
        assert vllm_config.model_config is not None and vllm_config.model_config.is_moe, (
            "DPEngineCoreProc should only be used for MoE models"
        )
        # Forward passes in this wave (identical on every DP rank).
        self.step_counter = 0
        self.current_wave = 0
        self.dp_group: ProcessGroup | None = None
        super().__init__(
            vllm_config,
            local_client,
            handshake_address,
            executor_class,
            log_stats,
            client_handshake_address,
            engine_index=engine_index,
        )

    def _init_data_parallel(self, vllm_config: VllmConfig) -> None:
        """The stateless gloo DP group, before the executor is built (the
        workers then pop the next DP port for their own world)."""
        parallel_config = vllm_config.parallel_config
        self.dp_rank = parallel_config.data_parallel_rank
        self.dp_size = parallel_config.data_parallel_size
        assert self.dp_size > 1 and 0 <= self.dp_rank < self.dp_size
        self.dp_group = parallel_config.stateless_init_dp_group()

    def shutdown(self) -> None:
        super().shutdown()
        # A ProcessGroupGloo has no destroy: dropping it closes its sockets.
        self.dp_group = None

    def sleep(self, level: int = 1, mode: str = "abort") -> Future[None] | None:
        """Refused. Deviation: upstream pauses all DP ranks together (a
        two-phase pause agreed over the DP group); here one sleeping rank
        would stop joining the MoE collectives and its peers would block in
        their forward pass, so sleep mode is not offered with MoE DP."""
        raise NotImplementedError(
            "Sleep mode (enable_sleep_mode / POST /sleep) is not supported for a "
            "mixture-of-experts model with data_parallel_size > 1 (--data-parallel-size): "
            "its engines step in lock-step."
        )

    # ------------------------------------------------------------------
    # Waves
    # ------------------------------------------------------------------

    def add_request(self, request: Request, request_wave: int = 0) -> None:
        super().add_request(request, request_wave)
        if self.has_coordinator and request_wave != self.current_wave:
            if request_wave > self.current_wave:
                self.current_wave = request_wave
            elif not self.engines_running:
                # Stamped with a finished wave: have the coordinator start the
                # next one on the other engines.
                self.engines_running = True
                self.output_queue.put_nowait((-1, EngineCoreOutputs(start_wave=self.current_wave)))

    def _handle_client_request(self, request_type: EngineCoreRequestType, request: Any) -> None:
        if request_type != EngineCoreRequestType.START_DP_WAVE:
            super()._handle_client_request(request_type, request)
            return
        new_wave, exclude_engine_index = request
        if exclude_engine_index != self.engine_index and new_wave >= self.current_wave:
            self.current_wave = new_wave
            if not self.engines_running:
                logger.debug("EngineCore starting idle loop for wave %d.", new_wave)
                self.engines_running = True

    def _maybe_publish_request_counts(self) -> None:
        """As the base, with this wave's step counter and number."""
        if not self.publish_dp_lb_stats:
            return
        counts = self.scheduler.get_request_counts()
        if counts != self.last_counts:
            self.last_counts = counts
            stats = SchedulerStats(
                num_running_reqs=counts[0],
                num_waiting_reqs=counts[1],
                step_counter=self.step_counter,
                current_wave=self.current_wave,
                kv_cache_usage=self.scheduler.kv_cache_manager.usage,
            )
            self.output_queue.put_nowait((-1, EngineCoreOutputs(scheduler_stats=stats)))

    # ------------------------------------------------------------------
    # The busy loop
    # ------------------------------------------------------------------

    def run_busy_loop(self) -> None:
        """Input, one forward pass (real or dummy), the wave's bookkeeping."""
        while True:
            self._process_input_queue()
            self._maybe_publish_request_counts()
            executed = self._process_engine_step()
            self._maybe_publish_request_counts()
            local_unfinished = self.scheduler.has_unfinished_requests()
            if not executed:
                if not local_unfinished and not self.engines_running:
                    continue  # every engine is idle
                if not self.sleep_manager.paused:
                    self.execute_dummy_batch()
            self.engines_running = self._has_global_unfinished_reqs(local_unfinished)
            if not self.engines_running:
                self._finish_wave()

    def execute_dummy_batch(self) -> None:
        """A one-token forward pass on every worker: this engine's share of
        the MoE collectives of a step in which it has nothing to run."""
        self.model_executor.collective_rpc("execute_dummy_batch")

    def _has_global_unfinished_reqs(self, local_unfinished: bool) -> bool:
        self.step_counter += 1
        if self.step_counter % DP_SYNC_INTERVAL_STEPS != 0:
            return True
        assert self.dp_group is not None
        return ParallelConfig.has_unfinished_dp(self.dp_group, local_unfinished)

    def _finish_wave(self) -> None:
        if self.dp_rank == 0 or not self.has_coordinator:
            logger.debug("Wave %d finished, pausing engine loop.", self.current_wave)
            client_index = -1 if self.has_coordinator else 0
            self.output_queue.put_nowait(
                (client_index, EngineCoreOutputs(wave_complete=self.current_wave))
            )
        self.current_wave += 1
        self.step_counter = 0
