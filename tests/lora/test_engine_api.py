"""The engine's LoRA API (issue 18 item 1): the LoRA flags build
`VllmConfig.lora_config` (or are refused naming the flag), a `LoRARequest`
crosses every msgpack boundary intact (front end -> core, core -> workers),
and requests with an adapter are accepted only when LoRA is enabled."""

from __future__ import annotations

import msgspec
import pytest
import torch

from vllm.config import LoRAConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.lora.request import LoRARequest
from vllm.usage.usage_lib import UsageContext
from vllm.utils.argparse_utils import FlexibleArgumentParser


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir) -> str:
    return tiny_model_dir("llama")


def _config(model_dir: str, **kwargs):
    args = EngineArgs(model=model_dir, device="cpu", **kwargs)
    return args.create_engine_config(UsageContext.LLM_CLASS)


# ---- flags -> LoRAConfig ----------------------------------------------------------------


def test_cli_flags_build_the_lora_config(model_dir):
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    argv = [
        "--model", model_dir, "--device", "cpu", "--enable-lora", "--max-loras", "3",
        "--max-lora-rank", "8", "--max-cpu-loras", "5", "--lora-dtype", "bfloat16",
        "--lora-target-modules", "o_proj", "qkv_proj", "--specialize-active-lora",
    ]  # fmt: skip
    config = EngineArgs.from_cli_args(parser.parse_args(argv)).create_engine_config()
    lora = config.lora_config
    assert isinstance(lora, LoRAConfig)
    assert (lora.max_loras, lora.max_lora_rank, lora.max_cpu_loras) == (3, 8, 5)
    assert lora.lora_dtype is torch.bfloat16  # the name resolved to a torch dtype
    assert lora.target_modules == ["o_proj", "qkv_proj"]
    assert lora.specialize_active_lora and not lora.fully_sharded_loras
    assert "lora=True" in str(config)


def test_defaults_and_auto_dtype(model_dir):
    assert _config(model_dir).lora_config is None  # LoRA is off by default
    for dtype, expected in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        config = _config(model_dir, enable_lora=True, dtype=dtype)
        lora = config.lora_config
        assert lora is not None and config.model_config is not None
        # Upstream's defaults; "auto" is the model's resolved dtype.
        assert (lora.max_loras, lora.max_lora_rank, lora.max_cpu_loras) == (1, 16, 1)
        assert lora.lora_dtype is config.model_config.dtype is expected
    assert lora.target_modules is None
    # As upstream: max_cpu_loras <= 0 means the default (max_loras).
    lora = _config(model_dir, enable_lora=True, max_loras=2, max_cpu_loras=0).lora_config
    assert lora is not None and lora.max_cpu_loras == 2
    # fully_sharded_loras: the sharded layers (tests/lora/test_layers_tp.py).
    for tp in (1, 2):
        config = _config(
            model_dir, enable_lora=True, fully_sharded_loras=True, tensor_parallel_size=tp
        )
        assert config.lora_config is not None and config.lora_config.fully_sharded_loras


def test_lora_config_changes_its_hash(model_dir):
    a = _config(model_dir, enable_lora=True, max_loras=2).lora_config
    b = _config(model_dir, enable_lora=True, max_loras=3).lora_config
    c = _config(model_dir, enable_lora=True, max_loras=2).lora_config
    assert a is not None and b is not None and c is not None
    assert a.compute_hash() != b.compute_hash()
    assert a.compute_hash() == c.compute_hash()


@pytest.mark.parametrize(
    "name,value",
    [
        ("max_loras", 2),
        ("max_lora_rank", 8),
        ("fully_sharded_loras", True),
        ("max_cpu_loras", 4),
        ("lora_dtype", "bfloat16"),
        ("lora_target_modules", ["o_proj"]),
        ("specialize_active_lora", True),
    ],
)
def test_lora_flags_without_enable_lora_are_refused(model_dir, name, value):
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ValueError, match=f"{name}=.*{flag}.*--enable-lora"):
        _config(model_dir, **{name: value})


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"max_loras": 0}, ValueError, r"max_loras \(0\) must be >= 1"),
        ({"max_loras": 3, "max_cpu_loras": 2}, ValueError, r"max_cpu_loras \(2\) must be >="),
        ({"max_lora_rank": 24}, ValueError, r"max_lora_rank \(24\) must be one of"),
        ({"lora_dtype": "float64"}, ValueError, r"lora_dtype \('float64'\) must be"),
        ({"lora_target_modules": "o_proj"}, ValueError, "target_modules must be a list"),
        (
            {"compilation_config": 3},
            NotImplementedError,
            r"enable_lora \(--enable-lora\) with compilation_config.mode=VLLM_COMPILE",
        ),
        (
            {"fully_sharded_loras": True, "tensor_parallel_size": 2, "max_lora_rank": 1},
            ValueError,
            (
                r"max_lora_rank \(1, --max-lora-rank\) must be divisible by "
                r"tensor_parallel_size \(2\) with fully_sharded_loras \(--fully-sharded-loras\)"
            ),
        ),
    ],
)
def test_bad_lora_settings_are_refused(model_dir, kwargs, error, match):
    with pytest.raises(error, match=match):
        _config(model_dir, enable_lora=True, **kwargs)


def test_cli_refuses_unlisted_rank_and_dtype():
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    for argv in (["--max-lora-rank", "24"], ["--lora-dtype", "float64"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)


# ---- LoRARequest over msgpack ---------------------------------------------------------


def _lora(**kwargs) -> LoRARequest:
    return LoRARequest("sql", 7, "/adapters/sql", base_model_name="base", **kwargs)


def test_lora_request_round_trips_in_an_engine_core_request():
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    request = EngineCoreRequest(
        request_id="r",
        prompt_token_ids=[1, 2, 3],
        mm_features=None,
        sampling_params=SamplingParams(max_tokens=2),
        pooling_params=None,
        eos_token_id=0,
        arrival_time=0.0,
        lora_request=_lora(load_inplace=True),
        cache_salt=None,
        data_parallel_rank=None,
    )
    decoded = MsgpackDecoder(EngineCoreRequest).decode(MsgpackEncoder().encode(request))
    got = decoded.lora_request
    assert isinstance(got, LoRARequest)
    assert (got.lora_name, got.lora_int_id, got.lora_path) == ("sql", 7, "/adapters/sql")
    assert got.base_model_name == "base" and got.load_inplace


def test_lora_request_round_trips_as_a_worker_rpc_argument():
    from vllm.distributed.device_communicators.rpc_codec import RpcDecoder, RpcEncoder

    frames = RpcEncoder().encode(((_lora(),), {}))
    (args, kwargs) = RpcDecoder().decode(frames)
    assert kwargs == {} and isinstance(args[0], LoRARequest)
    assert msgspec.structs.asdict(args[0]) == msgspec.structs.asdict(_lora())


# ---- InputProcessor ----------------------------------------------------------------------


def test_input_processor_passes_the_adapter_only_when_lora_is_enabled(model_dir):
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    prompt = {"prompt_token_ids": [1, 2, 3]}
    params = SamplingParams(max_tokens=2)
    enabled = InputProcessor(_config(model_dir, enable_lora=True), tokenizer=None)
    request = enabled.process_inputs("r", prompt, params, lora_request=_lora())
    assert request.lora_request == _lora() and request.lora_request.lora_int_id == 7
    assert enabled.process_inputs("r", prompt, params).lora_request is None
    disabled = InputProcessor(_config(model_dir), tokenizer=None)
    with pytest.raises(VLLMValidationError, match="but LoRA is not enabled!"):
        disabled.process_inputs("r", prompt, params, lora_request=_lora())


def test_utility_arguments_become_lora_requests_again():
    """A LoRARequest utility argument arrives as a msgpack array; the core
    rebuilds it from the method's annotation (upstream's _convert_msgspec_args)."""
    from vllm.v1.engine.core_proc import _convert_msgspec_args
    from vllm.v1.engine.engine_core import EngineCore
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    args = MsgpackDecoder().decode(MsgpackEncoder().encode(["x", (_lora(),)])[0])[1]
    assert isinstance(args[0], list)  # untyped on the wire
    (converted,) = _convert_msgspec_args(EngineCore.add_lora.__get__(object()), args)
    assert isinstance(converted, LoRARequest) and converted.base_model_name == "base"
    assert _convert_msgspec_args(EngineCore.remove_lora.__get__(object()), [3]) == [3]
    with pytest.raises(msgspec.ValidationError):
        _convert_msgspec_args(EngineCore.add_lora.__get__(object()), [["x"]])


def test_utility_failures_keep_their_kind():
    import concurrent.futures

    from vllm.exceptions import LoRAAdapterNotFoundError, VLLMNotFoundError
    from vllm.v1.engine import UtilityOutput
    from vllm.v1.engine.core_client_mp import _lora_not_found, _process_utility_output
    from vllm.v1.engine.core_proc import _set_failure

    def failed(error: Exception) -> BaseException | None:
        output = UtilityOutput(1)
        _set_failure(output, "add_lora", error)
        future: concurrent.futures.Future = concurrent.futures.Future()
        _process_utility_output(output, {1: future})
        return future.exception()

    not_found = failed(LoRAAdapterNotFoundError("sql", "/nowhere"))
    assert isinstance(not_found, VLLMNotFoundError)
    assert "Call to add_lora method failed: Loading lora sql failed: No adapter found" in str(
        not_found
    )
    with pytest.raises(LoRAAdapterNotFoundError) as info, _lora_not_found(_lora()):
        raise not_found
    assert (info.value.lora_name, info.value.lora_path) == ("sql", "/adapters/sql")
    assert type(failed(ValueError("rank 32 > max_lora_rank 16"))) is ValueError
    assert type(failed(RuntimeError("worker died"))) is Exception


def test_new_request_data_carries_the_adapter_to_the_workers():
    from vllm.distributed.device_communicators.rpc_codec import RpcDecoder, RpcEncoder
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.output import NewRequestData
    from vllm.v1.request import Request

    request = Request("r", [1, 2, 3], SamplingParams(max_tokens=2), lora_request=_lora())
    data = NewRequestData.from_request(request, ([4],))
    decoded = RpcDecoder().decode(RpcEncoder().encode(data))
    assert isinstance(decoded.lora_request, LoRARequest)
    assert decoded.lora_request.lora_int_id == 7 and decoded.lora_request == _lora()
