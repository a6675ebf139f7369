"""DPEngineCoreProc's wave bookkeeping without processes: START_DP_WAVE
starts the idle loop unless this engine is the excluded one or the wave is
stale; "unfinished" is all-reduced over the (real, one-rank gloo) DP group
only every 32 steps; a finished wave is reported by rank 0 to the
coordinator (client index -1) and the next wave starts at step 0."""

from __future__ import annotations

import datetime
import queue

import pytest
import torch.distributed as dist

from vllm.distributed.utils import get_open_port
from vllm.v1.engine import EngineCoreRequestType
from vllm.v1.engine.core_dp import DP_SYNC_INTERVAL_STEPS, DPEngineCoreProc


def _engine(engine_index: int) -> DPEngineCoreProc:
    # The wave logic only: no sockets, scheduler or executor.
    engine = DPEngineCoreProc.__new__(DPEngineCoreProc)
    engine.engine_index = engine.dp_rank = engine_index
    engine.current_wave = engine.step_counter = 0
    engine.engines_running = False
    engine.has_coordinator = True
    engine.output_queue = queue.Queue()
    engine.dp_group = None
    return engine


def test_start_dp_wave_wakes_every_engine_but_the_excluded_one():
    engine = _engine(1)
    engine._handle_client_request(EngineCoreRequestType.START_DP_WAVE, [3, 1])
    assert (engine.current_wave, engine.engines_running) == (0, False)  # excluded
    engine._handle_client_request(EngineCoreRequestType.START_DP_WAVE, [3, 0])
    assert (engine.current_wave, engine.engines_running) == (3, True)
    engine.engines_running = False
    engine._handle_client_request(EngineCoreRequestType.START_DP_WAVE, [2, 0])
    assert (engine.current_wave, engine.engines_running) == (3, False)  # stale wave


def test_unfinished_is_all_reduced_every_32_steps_and_rank0_reports_the_wave():
    store = dist.TCPStore("127.0.0.1", get_open_port(), 1, is_master=True)
    engine = _engine(0)
    engine.dp_group = dist.ProcessGroupGloo(store, 0, 1, datetime.timedelta(seconds=30))
    # Steps 1..31 do not consult the group: the wave goes on.
    assert all(engine._has_global_unfinished_reqs(False) for _ in range(31))
    assert engine._has_global_unfinished_reqs(True)  # step 32: this rank has work
    assert engine.step_counter == DP_SYNC_INTERVAL_STEPS
    for _ in range(31):
        engine._has_global_unfinished_reqs(False)
    assert not engine._has_global_unfinished_reqs(False)  # step 64: nobody has work
    engine._finish_wave()
    client_index, outputs = engine.output_queue.get_nowait()
    assert (client_index, outputs.wave_complete) == (-1, 0)
    assert (engine.current_wave, engine.step_counter) == (1, 0)
    other = _engine(1)
    other._finish_wave()  # only rank 0 reports
    assert other.output_queue.empty() and other.current_wave == 1


def test_sleep_mode_is_refused_for_lockstep_engines():
    with pytest.raises(NotImplementedError, match="data_parallel_size > 1"):
        _engine(0).sleep(1)
