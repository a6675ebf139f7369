"""A worker call's failure crosses the multiprocess executor's msgpack
response queue as a dict (vllm/v1/executor/worker_proc.py:encode_failure) and
is raised again as the same kind by the executor (decode_failure): a missing
LoRA adapter as LoRAAdapterNotFoundError with its name and path, a bad value
as ValueError with its message; any other error as a RuntimeError naming the
worker, the method and the traceback."""

from __future__ import annotations

import msgspec
import pytest

from vllm.exceptions import LoRAAdapterNotFoundError, VLLMNotFoundError
from vllm.v1.executor.worker_proc import decode_failure, encode_failure


def _through_queue(e: Exception) -> Exception:
    try:
        raise e
    except Exception as caught:
        payload = msgspec.msgpack.encode(encode_failure(caught))
    return decode_failure(1, "add_lora", msgspec.msgpack.decode(payload))


def test_lora_adapter_not_found_keeps_its_fields():
    err = _through_queue(LoRAAdapterNotFoundError("bad", "/nowhere"))
    assert type(err) is LoRAAdapterNotFoundError
    assert (err.lora_name, err.lora_path) == ("bad", "/nowhere")
    assert str(err) == "Loading lora bad failed: No adapter found for /nowhere"


@pytest.mark.parametrize(
    "error,cls",
    [
        (ValueError("LoRA rank 32 is greater than max_lora_rank 16."), ValueError),
        (TypeError("bad type"), TypeError),
        (NotImplementedError("not built"), NotImplementedError),
        (VLLMNotFoundError("no such thing"), VLLMNotFoundError),
    ],
)
def test_typed_errors_keep_kind_and_message(error, cls):
    err = _through_queue(error)
    assert type(err) is cls and str(err) == str(error)


def test_other_errors_name_worker_method_and_traceback():
    err = _through_queue(KeyError("slot"))
    assert type(err) is RuntimeError
    assert str(err).startswith("Worker 1 failed in add_lora: KeyError('slot')")
    assert "Traceback" in str(err)
    # A plain string (an older worker's failure) still reads as before.
    err = decode_failure(0, "execute_model", "boom")
    assert type(err) is RuntimeError and str(err) == "Worker 0 failed in execute_model: boom"


def test_workers_dying_at_start_up_fail_fast(tmp_path):
    """A script without `if __name__ == "__main__":` that starts two workers
    from an in-process engine core (VLLM_ENABLE_V1_MULTIPROCESSING=0; with
    the engine core in its own process, that process fails first and the
    client already reports it), with VLLM_WORKER_MULTIPROC_METHOD=spawn:
    each worker re-runs the script, fails in multiprocessing's bootstrap
    and exits. The parent must fail with upstream's "WorkerProc
    initialization failed" within seconds, not wait out the 600 s ready
    timeout (it used to)."""
    import os
    import subprocess
    import sys
    import time

    from tests.utils import make_tiny_model

    model = make_tiny_model("llama", tmp_path / "model", seed=0)
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from vllm import LLM\n"
        f"LLM(model={str(model)!r}, tensor_parallel_size=2, "
        "distributed_executor_backend='mp', enforce_eager=True, dtype='float32')\n"
    )
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=240,
        # Spawned workers re-run the script (the default, fork, runs it fine).
        env={
            **os.environ,
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
        },
    )
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "WorkerProc initialization failed" in proc.stderr, proc.stderr[-2000:]
    assert '__name__ == "__main__"' in proc.stderr
    assert elapsed < 200
