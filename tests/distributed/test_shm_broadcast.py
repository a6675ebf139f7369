"""MessageQueue: broadcast to local (shared memory) and remote (ZMQ) readers
in other processes, and no reader ever unpickles."""

from __future__ import annotations

import multiprocessing
import pathlib
import pickle
import re

import pytest
import torch

from vllm.distributed.device_communicators.rpc_codec import RpcDecodeError, RpcDecoder, RpcEncoder
from vllm.distributed.device_communicators.shm_broadcast import (
    MessageQueue,
    decode_handle,
    encode_handle,
)

VLLM_ROOT = pathlib.Path(__file__).resolve().parents[2] / "vllm"


def _reader(handle: bytes, rank: int, n: int, out) -> None:
    mq = MessageQueue.create_from_handle(decode_handle(handle), rank)
    mq.wait_until_ready(timeout=30)
    got = [mq.dequeue(timeout=30) for _ in range(n)]
    # A digest of what arrived: (index, tensor sum, payload length).
    digest = [(i, int(t.sum()), len(blob)) for i, t, blob in got]
    try:
        mq.dequeue(timeout=30)
        verdict = "accepted a pickle"
    except RpcDecodeError:
        verdict = "rejected"
    # One message per reader: the readers share `out`, so separate puts interleave.
    out.put((rank, digest, verdict, mq.dequeue(timeout=30)))
    mq.close()


def test_broadcast_across_processes_local_and_remote():
    """Two shared-memory readers and one ZMQ reader, in three processes, all get
    every message in order, big ones (overflow over ZMQ) included; a pickle
    payload written into the queue is rejected by each, which keeps serving."""
    ctx = multiprocessing.get_context("spawn")
    writer = MessageQueue(3, 2, max_chunk_bytes=4096, max_chunks=3, connect_ip="127.0.0.1")
    out = ctx.Queue()
    handle = encode_handle(writer.export_handle())
    n = 12
    procs = [ctx.Process(target=_reader, args=(handle, rank, n, out)) for rank in range(3)]
    for p in procs:
        p.start()
    try:
        writer.wait_until_ready(timeout=60)
        # Sizes straddle the 4 KiB chunk: small messages inline, big ones overflow.
        for i in range(n):
            writer.enqueue((i, torch.arange(i * 120), b"x" * (i * 500)))
        writer._write_frames([pickle.dumps(("execute_model", (), {}, None))])
        writer.enqueue("still serving")
        expected = [(i, sum(range(i * 120)), i * 500) for i in range(n)]
        results = sorted(out.get(timeout=60) for _ in range(3))
        assert [r[0] for r in results] == [0, 1, 2]
        for _, digest, verdict, last in results:
            assert digest == expected
            assert verdict == "rejected"
            assert last == "still serving"
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        writer.close()
    assert all(p.exitcode == 0 for p in procs)


def test_rpc_codec_round_trip_and_refusals():
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    new = NewRequestData(
        req_id="r",
        prompt_token_ids=[1, 2],
        mm_features=[],
        sampling_params=SamplingParams(temperature=0.0, max_tokens=3, stop_token_ids=[5]),
        pooling_params=None,
        block_ids=([1, 2],),
        num_computed_tokens=0,
        lora_request=None,
    )
    so = SchedulerOutput(
        scheduled_new_reqs=[new],
        scheduled_cached_reqs=CachedRequestData.make_empty(),
        num_scheduled_tokens={"r": 2},
        total_num_scheduled_tokens=2,
        scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={},
        num_common_prefix_blocks=[0],
        finished_req_ids={"old"},
        free_encoder_mm_hashes=[],
    )
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.bfloat16)
    value = (so, {"spec": spec, 7: (1, [2])}, {"__t": "not a tag"})
    back = RpcDecoder().decode(RpcEncoder().encode(value))
    assert back[0] == so and back[0].scheduled_new_reqs[0].block_ids == ([1, 2],)
    assert back[0].scheduled_new_reqs[0].sampling_params.all_stop_token_ids == {5}
    assert back[1] == value[1] and back[1]["spec"].dtype is torch.bfloat16
    assert back[2] == {"__t": "not a tag"}

    with pytest.raises(TypeError):
        RpcEncoder().encode(lambda worker: 1)  # no code over RPC
    import msgspec

    for forged in (
        {"__t": "obj", "c": "os:system", "s": {}},
        {"__t": "obj", "c": "vllm.v1.outputs:__class__", "s": {}},
        {"__t": "obj", "c": "vllm.logger:init_logger", "s": {}},
        {"__t": "dtype", "v": "complex128"},
        # Malformed tagged values are bad messages too, not a TypeError or
        # ValueError out of the reader (found by mypy: "v" may be missing).
        {"__t": "tuple"},
        {"__t": "set", "v": 3},
        {"__t": "dict", "v": [[1]]},
        {"__t": "nt", "c": "vllm.v1.outputs:LogprobsLists", "v": [1]},
        {"__t": "enum", "c": "vllm.v1.request:RequestStatus", "v": 999},
        {"__t": "obj", "c": "vllm.sampling_params:SamplingParams", "s": {"temperature": "x"}},
    ):
        with pytest.raises(RpcDecodeError):
            RpcDecoder().decode(msgspec.msgpack.encode(forged))


def test_no_reader_unpickles():
    """No module reads sockets or shared memory with pickle: neither
    pickle.loads/load, cloudpickle nor ZMQ's recv_pyobj appears in vllm/."""
    pattern = re.compile(r"pickle\.loads?\(|recv_pyobj|import cloudpickle|Unpickler")
    offenders = [
        f"{path.relative_to(VLLM_ROOT)}:{n}"
        for path in VLLM_ROOT.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and not line.lstrip().startswith("#")
    ]
    assert offenders == []


def test_writer_does_not_wait_for_ever_on_a_reader_that_stopped():
    """A full ring (the reader stopped reading, e.g. died) makes enqueue fail
    after its timeout, or at once when the cancel event is set."""
    import threading

    writer = MessageQueue(1, 1, max_chunk_bytes=1024, max_chunks=2)
    reader = MessageQueue.create_from_handle(writer.export_handle(), 0)
    ready = threading.Thread(target=reader.wait_until_ready, args=(10,))
    ready.start()
    writer.wait_until_ready(timeout=10)
    ready.join()
    try:
        writer.enqueue(1)
        writer.enqueue(2)
        with pytest.raises(TimeoutError):
            writer.enqueue(3, timeout=0.2)
        cancel = threading.Event()
        cancel.set()
        with pytest.raises(RuntimeError):
            writer.enqueue(3, cancel=cancel)
        assert reader.dequeue(timeout=5) == 1  # a chunk frees up
        writer.enqueue(3, timeout=5)
        assert [reader.dequeue(timeout=5) for _ in range(2)] == [2, 3]
    finally:
        reader.close()
        writer.close()


# Run in a fresh interpreter: a writer with a shared-memory and a ZMQ (tcp)
# reader, in reference cycles (as an engine's objects are), dropped without
# close(). First set: collected by gc.collect() while messages are pending;
# second: left for interpreter exit with a 20 MiB zero-copy overflow message
# still on its sockets. Prints CLOCK_MONOTONIC (shared by all processes) when
# it starts dropping.
_DROP_SCRIPT = """
import gc, threading, time
from vllm.distributed.device_communicators.shm_broadcast import MessageQueue

def pair(big):
    w = MessageQueue(2, 1, connect_ip="127.0.0.1")
    readers = [MessageQueue.create_from_handle(w.export_handle(), r) for r in (0, 1)]
    t = threading.Thread(target=w.wait_until_ready, args=(30,))
    t.start()
    for r in readers:
        r.wait_until_ready(timeout=30)
    t.join()
    for obj in ("first", ("big", b"z" * (20 << 20)) if big else "second", "third"):
        w.enqueue(obj)
    assert [r.dequeue(timeout=30) for r in readers] == ["first", "first"]
    for mq in (w, *readers):
        mq.cycle = mq
    return w, readers

queues = pair(big=False)
print("dropping", time.monotonic(), flush=True)
del queues
gc.collect()
print("collected", flush=True)
queues = pair(big=True)
"""


def test_queues_left_to_gc_and_exit_do_not_hang_or_abort():
    """pyzmq's Context.__del__ closes the sockets it still tracks, by weak
    reference, then terminates; in a collected cycle those references are
    already cleared, so term() used to wait for ever on the open sockets. At
    exit pyzmq's hook freed zero-copy frames libzmq was still sending (abort,
    "Bad address"). Both now exit at once, the process with status 0."""
    import subprocess
    import sys
    import time

    proc = subprocess.run(
        [sys.executable, "-c", _DROP_SCRIPT], capture_output=True, text=True, timeout=120
    )
    ended = time.monotonic()
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split()
    assert lines[0] == "dropping" and lines[-1] == "collected", proc.stdout
    # From the first drop to the process's end: one gc, one more pair, exit.
    assert ended - float(lines[1]) < 30
