"""The msgpack codec of the engine's messages: round trips, out-of-band
tensors, and refusal of anything that is not a typed message (pickle above all)."""

from __future__ import annotations

import pathlib
import pickle
import re

import msgspec
import numpy as np
import pytest
import torch

from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    FinishReason,
    UtilityOutput,
    UtilityResult,
)
from vllm.v1.outputs import LogprobsLists, LogprobsTensors
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

VLLM_ROOT = pathlib.Path(__file__).resolve().parents[1] / "vllm"


def _request() -> EngineCoreRequest:
    sp = SamplingParams(
        temperature=0.7,
        top_k=5,
        stop=["x"],
        max_tokens=9,
        min_tokens=2,
        output_kind=RequestOutputKind.DELTA,
        logprobs=3,
    )
    sp.update_from_generation_config({}, eos_token_id=7)
    return EngineCoreRequest(
        request_id="r-1",
        prompt_token_ids=[1, 2, 3],
        mm_features=None,
        sampling_params=sp,
        pooling_params=None,
        eos_token_id=7,
        arrival_time=12.5,
        lora_request=None,
        cache_salt="s",
        data_parallel_rank=None,
        priority=3,
        external_req_id="r",
    )


def test_request_round_trip_keeps_engine_fields():
    req = _request()
    out = MsgpackDecoder(EngineCoreRequest).decode(MsgpackEncoder().encode(req))
    assert out.request_id == "r-1" and out.external_req_id == "r"
    assert out.prompt_token_ids == [1, 2, 3] and out.priority == 3 and out.cache_salt == "s"
    sp = out.sampling_params
    assert (sp.temperature, sp.top_k, sp.max_tokens, sp.min_tokens) == (0.7, 5, 9, 2)
    assert sp.output_kind == RequestOutputKind.DELTA and sp.stop == ["x"]
    # Fields the engine filled in must survive the trip (min_tokens masks EOS).
    assert sp.eos_token_id == 7 and 7 in sp.all_stop_token_ids
    assert sp.output_text_buffer_length == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.int32])
@pytest.mark.parametrize("rows", [0, 1, 64])
def test_tensors_round_trip(dtype, rows):
    ids = torch.arange(rows * 4, dtype=torch.int64).reshape(rows, 4)
    vals = torch.randn(rows, 4).to(dtype)
    ranks = torch.arange(rows, dtype=torch.int32)
    out = EngineCoreOutputs(
        outputs=[
            EngineCoreOutput(
                "a", [5], new_prompt_logprobs_tensors=LogprobsTensors(ids, vals, ranks)
            )
        ]
    )
    bufs = MsgpackEncoder().encode(out)
    if rows == 64:
        # Large arrays travel as extra frames, not inside the msgpack body.
        assert len(bufs) > 1 and len(bufs[0]) < vals.numel() * vals.element_size()
    got = MsgpackDecoder(EngineCoreOutputs).decode(bufs).outputs[0]
    t = got.new_prompt_logprobs_tensors
    assert t.logprobs.dtype == dtype and torch.equal(t.logprobs, vals)
    assert torch.equal(t.logprob_token_ids, ids) and torch.equal(t.selected_token_ranks, ranks)


def test_outputs_round_trip():
    out = EngineCoreOutputs(
        engine_index=0,
        outputs=[
            EngineCoreOutput(
                "a",
                [1, 2],
                new_logprobs=LogprobsLists([[1, 4]], [[-0.5, -1.0]], [1]),
                finish_reason=FinishReason.LENGTH,
                stop_reason="st",
            )
        ],
        utility_output=UtilityOutput(4, result=UtilityResult({"x": [1, 2]})),
        finished_requests={"b"},
    )
    got = MsgpackDecoder(EngineCoreOutputs).decode(MsgpackEncoder().encode(out))
    assert got.outputs[0].finish_reason == FinishReason.LENGTH
    assert got.outputs[0].new_logprobs == LogprobsLists([[1, 4]], [[-0.5, -1.0]], [1])
    assert got.utility_output.call_id == 4 and got.utility_output.result == {"x": [1, 2]}
    assert got.finished_requests == {"b"}


def test_numpy_round_trip():
    arr = np.arange(100, dtype=np.int32).reshape(10, 10)
    got = MsgpackDecoder(np.ndarray).decode(MsgpackEncoder().encode(arr))
    assert got.dtype == np.int32 and np.array_equal(got, arr)


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickle_payload_is_rejected():
    payload = pickle.dumps(_Evil())
    for t in (EngineCoreRequest, EngineCoreOutputs, list[str]):
        with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
            MsgpackDecoder(t).decode([payload])
    # Objects msgpack cannot express are refused, never pickled.
    with pytest.raises(TypeError, match="not serializable"):
        MsgpackEncoder().encode(_Evil())


def test_bad_array_messages_are_rejected():
    dec = MsgpackDecoder(LogprobsTensors)
    enc = msgspec.msgpack.Encoder()
    evil_dtype = enc.encode([["os.system", [1], b"\0" * 4]] * 3)
    with pytest.raises(msgspec.ValidationError, match="not allowed"):
        dec.decode(evil_dtype)
    missing_frame = enc.encode([["int64", [100], 5]] * 3)
    with pytest.raises(msgspec.ValidationError, match="missing frame"):
        dec.decode([missing_frame])
    wrong_size = enc.encode([["int64", [100], b"\0" * 8]] * 3)
    with pytest.raises(msgspec.ValidationError, match="does not match"):
        dec.decode(wrong_size)
    unknown_ext = enc.encode(msgspec.msgpack.Ext(1, b"cos\nsystem\n"))
    with pytest.raises(msgspec.ValidationError, match="extension type"):
        MsgpackDecoder().decode(unknown_ext)


def test_no_socket_reader_unpickles():
    """No module reads pickles off a socket or shared memory."""
    pattern = re.compile(
        r"pickle\.loads?\(|recv_pyobj|cloudpickle\.loads?\(|"
        r"torch\.load\(.*(sock|frame|msg)"
    )
    offenders = [
        f"{p.relative_to(VLLM_ROOT)}:{i}"
        for p in VLLM_ROOT.rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
