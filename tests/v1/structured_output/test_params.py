"""StructuredOutputsParams validation, its trip through the engine's msgpack
codec, StructuredOutputsConfig and GrammarOutput on the wire."""

from __future__ import annotations

import numpy as np
import pytest

from vllm.config import StructuredOutputsConfig, VllmConfig
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.v1.core.sched.output import GrammarOutput
from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

ONE_KIND = [
    dict(json=SCHEMA),
    dict(json='{"type": "string"}'),
    dict(regex=r"\d+"),
    dict(choice=["yes", "no"]),
    dict(grammar='root ::= "a"'),
    dict(json_object=True),
    dict(structural_tag='{"structures": [], "triggers": []}'),
]


@pytest.mark.parametrize("kwargs", ONE_KIND, ids=lambda k: next(iter(k)))
def test_exactly_one_kind_is_accepted(kwargs):
    params = StructuredOutputsParams(**kwargs)
    assert getattr(params, next(iter(kwargs))) == next(iter(kwargs.values()))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(json_object=False),
        dict(regex="a", choice=["b"]),
        dict(json=SCHEMA, json_object=True),
        dict(grammar='root ::= "a"', regex="a"),
    ],
)
def test_zero_or_several_kinds_are_refused(kwargs):
    with pytest.raises(VLLMValidationError, match="one kind of structured outputs"):
        StructuredOutputsParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(regex={1: "a"}),
        dict(regex=3),
        dict(choice=[]),
        dict(choice=["a", 1]),
        dict(choice="ab"),
        dict(json=5),
        dict(json_object="yes"),
        dict(grammar=["x"]),
    ],
)
def test_wrong_types_are_refused(kwargs):
    with pytest.raises(ValueError):
        StructuredOutputsParams(**kwargs)


def test_dict_schema_is_kept_and_serialised_for_the_compiler():
    params = StructuredOutputsParams(json=SCHEMA)
    assert params.json is SCHEMA
    assert params.json_str is not None and '"required": ["a"]' in params.json_str
    assert StructuredOutputsParams(json='{"x": 1}').json_str == '{"x": 1}'


@pytest.mark.parametrize("kwargs", ONE_KIND, ids=lambda k: next(iter(k)))
def test_round_trip_through_the_engine_codec(kwargs):
    so = StructuredOutputsParams(**kwargs, disable_any_whitespace=True)
    so._backend, so._backend_was_auto = "xgrammar", True
    params = SamplingParams(max_tokens=7, structured_outputs=so)
    frames = MsgpackEncoder().encode(params)
    assert b"pickle" not in bytes(frames[0])
    decoded = MsgpackDecoder(SamplingParams).decode(frames)
    assert isinstance(decoded.structured_outputs, StructuredOutputsParams)
    assert decoded.structured_outputs == so
    assert decoded.structured_outputs._backend == "xgrammar"
    assert decoded.structured_outputs._backend_was_auto is True
    assert decoded.max_tokens == 7


def test_params_without_constraint_round_trip_as_none():
    decoded = MsgpackDecoder(SamplingParams).decode(MsgpackEncoder().encode(SamplingParams()))
    assert decoded.structured_outputs is None


def test_grammar_output_round_trips_without_pickle():
    bitmask = np.arange(2 * 17, dtype=np.int32).reshape(2, 17) - 5
    out = GrammarOutput(structured_output_request_ids=["r1", "r0"], grammar_bitmask=bitmask)
    frames = MsgpackEncoder().encode(out)
    decoded = MsgpackDecoder(GrammarOutput).decode(frames)
    assert decoded.structured_output_request_ids == ["r1", "r0"]
    assert decoded.grammar_bitmask.dtype == np.int32
    np.testing.assert_array_equal(decoded.grammar_bitmask, bitmask)


def test_config_defaults_and_refused_backends():
    assert VllmConfig().structured_outputs_config == StructuredOutputsConfig()
    assert StructuredOutputsConfig().backend == "auto"
    assert StructuredOutputsConfig(backend="xgrammar").backend == "xgrammar"
    for name in ("guidance", "outlines", "lm-format-enforcer"):
        with pytest.raises(
            ValueError, match="not built in this implementation; use 'xgrammar' or 'auto'"
        ):
            StructuredOutputsConfig(backend=name)
    with pytest.raises(ValueError, match="Unknown structured outputs backend"):
        StructuredOutputsConfig(backend="nope")
