"""CUDA graph configuration and dispatch (no GPU needed): mode parsing and
resolution, capture sizes and their clipping, the dispatcher's keys and
padding decisions."""

import pytest

from vllm.config.compilation import (
    ATTENTION_SPLITTING_OPS,
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
    default_capture_sizes,
)
from vllm.engine.arg_utils import EngineArgs
from vllm.forward_context import BatchDescriptor
from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

M = CUDAGraphMode


def test_mode_helpers():
    assert M.FULL_AND_PIECEWISE.decode_mode() == M.FULL
    assert M.FULL_AND_PIECEWISE.mixed_mode() == M.PIECEWISE
    assert M.FULL_DECODE_ONLY.mixed_mode() == M.NONE
    assert M.FULL.decode_mode() == M.FULL and M.FULL.mixed_mode() == M.FULL
    assert [m.separate_routine() for m in M] == [False, False, False, True, True]
    assert [m.has_full_cudagraphs() for m in M] == [False, False, True, True, True]
    assert [m.has_piecewise_cudagraphs() for m in M] == [False, True, False, False, True]
    assert M.FULL_AND_PIECEWISE.requires_piecewise_compilation()
    assert M.FULL_AND_PIECEWISE.max_cudagraph_mode() == M.FULL
    assert M.valid_runtime_modes() == {M.NONE, M.PIECEWISE, M.FULL}
    assert not M.FULL_DECODE_ONLY.is_valid_runtime_mode()
    with pytest.raises(ValueError):
        M.FULL.has_mode(M.FULL_DECODE_ONLY)
    assert str(M.FULL) == "FULL"


@pytest.mark.parametrize(
    "value, mode",
    [
        ("FULL_DECODE_ONLY", M.FULL_DECODE_ONLY),
        ("full", M.FULL),
        (" none ", M.NONE),
        (2, M.FULL),
        (M.PIECEWISE, M.PIECEWISE),
    ],
)
def test_mode_parsing(value, mode):
    assert CompilationConfig(cudagraph_mode=value).cudagraph_mode == mode


@pytest.mark.parametrize("value", ["FULLY", 7, True, None.__class__])
def test_bad_mode_is_a_clear_error(value):
    with pytest.raises(ValueError, match="cudagraph_mode"):
        CompilationConfig(cudagraph_mode=value)


@pytest.mark.parametrize(
    "requested, device, eager, resolved",
    [
        # upstream's default; without VLLM_COMPILE (not the default here) the
        # piecewise half is dropped
        (None, "cuda", False, M.FULL_DECODE_ONLY),
        ("FULL_AND_PIECEWISE", "cuda", False, M.FULL_DECODE_ONLY),
        ("PIECEWISE", "cuda", False, M.NONE),
        ("FULL", "cuda", False, M.FULL),
        ("FULL_DECODE_ONLY", "cuda", False, M.FULL_DECODE_ONLY),
        ("FULL", "cuda", True, M.NONE),
        ("FULL", "cpu", False, M.NONE),
        (None, "cpu", False, M.NONE),
    ],
)
def test_resolution(requested, device, eager, resolved):
    config = CompilationConfig(cudagraph_mode=requested)
    config.resolve(device, eager)
    assert config.cudagraph_mode == resolved
    assert config.splitting_ops is None  # nothing to split for


@pytest.mark.parametrize(
    "requested, splitting_ops, resolved, resolved_ops",
    [
        # VLLM_COMPILE splits the graph at attention: piecewise graphs stay.
        (None, None, M.FULL_AND_PIECEWISE, list(ATTENTION_SPLITTING_OPS)),
        ("PIECEWISE", None, M.PIECEWISE, list(ATTENTION_SPLITTING_OPS)),
        ("FULL", None, M.FULL, None),
        ("PIECEWISE", ["vllm::unified_attention"], M.PIECEWISE, ["vllm::unified_attention"]),
        # Nothing to split at: only the full-graph half is left.
        ("FULL_AND_PIECEWISE", [], M.FULL_DECODE_ONLY, []),
    ],
)
def test_resolution_under_vllm_compile(requested, splitting_ops, resolved, resolved_ops):
    config = CompilationConfig(
        mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=requested, splitting_ops=splitting_ops
    )
    config.resolve("cuda", False)
    assert config.cudagraph_mode == resolved
    assert config.splitting_ops == resolved_ops
    config = CompilationConfig(mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=requested)
    config.resolve("cpu", False)
    assert config.cudagraph_mode == M.NONE and config.splitting_ops is None


def test_capture_sizes_default_and_clipping():
    assert default_capture_sizes(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert default_capture_sizes()[-3:] == [480, 496, 512]
    config = CompilationConfig(cudagraph_mode="FULL")
    config.resolve("cuda", False)
    assert config.max_cudagraph_capture_size == 512
    # The worker re-runs the sizing with the scheduler's limits: 2 * max_num_seqs.
    config.set_cudagraph_sizes(max_num_batched_tokens=8192, max_num_seqs=20)
    assert config.max_cudagraph_capture_size == 40
    assert config.cudagraph_capture_sizes == [1, 2, 4, 8, 16, 24, 32, 40]
    # Given sizes: sorted, deduplicated, clipped to max_num_batched_tokens.
    config = CompilationConfig(cudagraph_capture_sizes=[64, 8, 1, 8, 300])
    config.resolve("cuda", False, max_num_batched_tokens=256, max_num_seqs=4)
    assert config.cudagraph_capture_sizes == [1, 8, 64]
    assert config.max_cudagraph_capture_size == 64
    # An explicit max clips the given sizes.
    config = CompilationConfig(cudagraph_capture_sizes=[1, 2, 4, 8], max_cudagraph_capture_size=3)
    config.resolve("cuda", False)
    assert config.cudagraph_capture_sizes == [1, 2]
    with pytest.raises(ValueError, match="positive"):
        CompilationConfig(cudagraph_capture_sizes=[0, 4])


def test_cli_compilation_config():
    parser = EngineArgs.add_cli_args(__import__("argparse").ArgumentParser())
    args = parser.parse_args(
        [
            "--model",
            "m",
            "-cc",
            ('{"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]}'),
        ]
    )
    engine_args = EngineArgs.from_cli_args(args)
    config = engine_args._create_compilation_config()
    assert config.cudagraph_mode == M.FULL_DECODE_ONLY
    assert config.cudagraph_capture_sizes == [1, 2, 4]
    with pytest.raises(ValueError, match="cudagraph_mod"):
        EngineArgs(
            model="m", compilation_config={"cudagraph_mod": "FULL"}
        )._create_compilation_config()


class _Cfg:
    """The two sub-configs the dispatcher reads."""

    def __init__(self, mode, sizes, max_tokens=64, max_seqs=8):
        self.compilation_config = CompilationConfig(
            cudagraph_mode=mode, cudagraph_capture_sizes=sizes
        )
        self.compilation_config.resolve("cuda", False, max_tokens, max_seqs)
        self.scheduler_config = type(
            "S", (), dict(max_num_batched_tokens=max_tokens, max_num_seqs=max_seqs)
        )()


def _dispatcher(mode, sizes=(1, 2, 4, 8, 16, 32), **kw):
    cfg = _Cfg(mode, list(sizes), **kw)
    d = CudagraphDispatcher(cfg)
    d.initialize_cudagraph_keys(cfg.compilation_config.cudagraph_mode, 1)
    return d


def test_keys_per_mode():
    d = _dispatcher("FULL_DECODE_ONLY")
    # decode keys only up to max_num_seqs (8) requests of one token
    assert d.cudagraph_keys[M.FULL] == {BatchDescriptor(s, s, uniform=True) for s in (1, 2, 4, 8)}
    assert not d.cudagraph_keys[M.PIECEWISE]
    d = _dispatcher("FULL")
    assert d.cudagraph_keys[M.FULL] == {BatchDescriptor(s) for s in (1, 2, 4, 8, 16, 32)}
    assert not _dispatcher("NONE").cudagraph_keys[M.FULL]
    # Keys are what the runner passes, even a mode the config would narrow.
    d.initialize_cudagraph_keys(M.FULL_AND_PIECEWISE, 1)
    assert len(d.cudagraph_keys[M.PIECEWISE]) == 6 and len(d.cudagraph_keys[M.FULL]) == 4
    descs = dict(d.get_capture_descs())
    assert [x.num_tokens for x in descs[M.FULL]] == [8, 4, 2, 1]  # largest first


def test_dispatch_pads_to_next_size_and_falls_back_to_eager():
    d = _dispatcher("FULL_DECODE_ONLY")
    assert d.dispatch(3, uniform_decode=True, num_reqs=3) == (
        M.FULL,
        BatchDescriptor(4, 4, uniform=True),
    )
    assert d.dispatch(8, uniform_decode=True, num_reqs=8) == (
        M.FULL,
        BatchDescriptor(8, 8, uniform=True),
    )
    # mixed batch: no mixed graphs in this mode -> eager, unpadded
    assert d.dispatch(3, uniform_decode=False, num_reqs=2) == (
        M.NONE,
        BatchDescriptor(3, 2, uniform=False),
    )
    # more decodes than the largest decode graph -> eager
    mode, desc = d.dispatch(9, uniform_decode=True, num_reqs=9)
    assert mode == M.NONE and desc.num_tokens == 9

    d = _dispatcher("FULL")
    assert d.dispatch(13) == (M.FULL, BatchDescriptor(16))
    assert d.dispatch(3, uniform_decode=True, num_reqs=3) == (M.FULL, BatchDescriptor(4))
    assert d.dispatch(33)[0] == M.NONE  # above the largest capture size
    assert d.dispatch(13, disable_full=True)[0] == M.NONE
    # keys not initialised: always eager
    fresh = CudagraphDispatcher(_Cfg("FULL", [1, 2]))
    assert fresh.dispatch(1) == (M.NONE, BatchDescriptor(1))


@pytest.mark.parametrize(
    "supports, pp, moe, expected",
    [
        (["ALWAYS"], 1, False, M.FULL),
        (["ALWAYS", "UNIFORM_BATCH"], 1, False, M.FULL_DECODE_ONLY),  # weakest backend wins
        (["ALWAYS", "NEVER"], 1, False, M.NONE),
        (["ALWAYS"], 2, False, M.NONE),  # pipeline parallelism runs eagerly
        (["ALWAYS"], 1, True, M.NONE),  # the MoE layer syncs with the host
    ],
)
def test_mode_narrowed_by_backends_and_layout(supports, pp, moe, expected):
    from types import SimpleNamespace

    from vllm.v1.attention.backend import AttentionCGSupport
    from vllm.v1.worker.cudagraph_padding import resolve_cudagraph_mode

    def group(support):
        builder = type(
            "B",
            (),
            {
                "get_cudagraph_support": classmethod(
                    lambda cls, cfg, spec: AttentionCGSupport[support]
                )
            },
        )()
        return SimpleNamespace(metadata_builder=builder, kv_cache_spec=None)

    cfg = SimpleNamespace(
        compilation_config=CompilationConfig(cudagraph_mode="FULL"),
        parallel_config=SimpleNamespace(pipeline_parallel_size=pp),
        model_config=SimpleNamespace(is_moe=moe),
    )
    assert resolve_cudagraph_mode(cfg, [[group(s) for s in supports]]) == expected
    cfg.compilation_config.cudagraph_mode = M.NONE
    assert resolve_cudagraph_mode(cfg, [[group("ALWAYS")]]) == M.NONE
    # Piecewise graphs hold no attention: a backend without graph support keeps them.
    cfg.compilation_config.cudagraph_mode = M.FULL_AND_PIECEWISE
    if (pp, moe) == (1, False):
        assert resolve_cudagraph_mode(cfg, [[group("NEVER")]]) == M.PIECEWISE
        assert resolve_cudagraph_mode(cfg, [[group("UNIFORM_BATCH")]]) == M.FULL_AND_PIECEWISE
        # A stateful layer outside attention (a graph break) drops the piecewise half.
        import torch

        cfg.compilation_config.static_forward_context["model.layers.0.mamba"] = torch.nn.Module()
        assert resolve_cudagraph_mode(cfg, [[group("ALWAYS")]]) == M.FULL_DECODE_ONLY
        cfg.compilation_config.cudagraph_mode = M.PIECEWISE
        assert resolve_cudagraph_mode(cfg, [[group("ALWAYS")]]) == M.NONE
        cfg.compilation_config.cudagraph_mode = M.FULL
        assert resolve_cudagraph_mode(cfg, [[group("ALWAYS")]]) == M.FULL


def test_wrapper_passes_through_outside_its_mode(tmp_path):
    """Without a FULL runtime mode in the forward context the wrapper is the
    model itself (no CUDA needed); FULL without a descriptor is an error."""
    import torch

    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.config import VllmConfig
    from vllm.forward_context import set_forward_context

    class Model(torch.nn.Module):
        scale = 3.0

        def forward(self, x):
            return x * self.scale

    config = VllmConfig()
    model = Model()
    wrapped = CUDAGraphWrapper(model, config, M.FULL)
    x = torch.ones(2)
    with set_forward_context(None, config):
        assert wrapped(x).tolist() == [3.0, 3.0]
    with set_forward_context(
        None, config, cudagraph_runtime_mode=M.PIECEWISE, batch_descriptor=BatchDescriptor(2)
    ):
        assert wrapped(x).tolist() == [3.0, 3.0]  # not this wrapper's mode
    with (
        set_forward_context(None, config, cudagraph_runtime_mode=M.FULL),
        pytest.raises(RuntimeError, match="batch descriptor"),
    ):
        wrapped(x)
    assert not wrapped.concrete_cudagraph_entries
    assert wrapped.scale == 3.0 and wrapped.unwrap() is model
    with pytest.raises(ValueError, match="FULL or PIECEWISE"):
        CUDAGraphWrapper(model, config, M.FULL_DECODE_ONLY)
    with (
        pytest.raises(ValueError, match="runtime_mode"),
        set_forward_context(None, config, cudagraph_runtime_mode=M.FULL_DECODE_ONLY),
    ):
        pass
