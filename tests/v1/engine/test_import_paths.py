"""Upstream's import paths of the engine core and its clients work: upstream
keeps these classes in vllm/v1/engine/core.py and core_client.py, which here
re-export them from the modules that define them (without module
`__getattr__` shims, and without import cycles: see .importlinter)."""

from __future__ import annotations

import importlib

import pytest

UPSTREAM_PATHS = [
    ("vllm.v1.engine.core", "EngineCore", "vllm.v1.engine.engine_core"),
    ("vllm.v1.engine.core", "EngineCoreProc", "vllm.v1.engine.core_proc"),
    ("vllm.v1.engine.core_client", "EngineCoreClient", "vllm.v1.engine.core_client_base"),
    ("vllm.v1.engine.core_client", "InprocClient", "vllm.v1.engine.core_client_base"),
    ("vllm.v1.engine.core_client", "MPClient", "vllm.v1.engine.core_client_mp"),
    ("vllm.v1.engine.core_client", "SyncMPClient", "vllm.v1.engine.core_client_mp"),
    ("vllm.v1.engine.core_client", "AsyncMPClient", "vllm.v1.engine.core_client_mp"),
]


@pytest.mark.parametrize(("module", "name", "home"), UPSTREAM_PATHS)
def test_upstream_path_imports_the_defining_class(module: str, name: str, home: str) -> None:
    imported = getattr(importlib.import_module(module), name)
    # The same class, not a copy: isinstance checks agree whichever path is used.
    assert imported is getattr(importlib.import_module(home), name)
    assert imported.__module__ == home


def test_upstream_modules_export_plainly() -> None:
    # Plain attributes: a module-level __getattr__ would hide an import cycle.
    for module in {m for m, _, _ in UPSTREAM_PATHS}:
        mod = importlib.import_module(module)
        assert not hasattr(mod, "__getattr__"), module
        assert set(mod.__all__) >= {n for m, n, _ in UPSTREAM_PATHS if m == module}


def test_clients_subclass_the_interface() -> None:
    from vllm.v1.engine.core import EngineCore, EngineCoreProc
    from vllm.v1.engine.core_client import (
        AsyncMPClient,
        EngineCoreClient,
        InprocClient,
        MPClient,
        SyncMPClient,
    )

    assert issubclass(EngineCoreProc, EngineCore)
    for client in (InprocClient, MPClient, SyncMPClient, AsyncMPClient):
        assert issubclass(client, EngineCoreClient)
    assert issubclass(SyncMPClient, MPClient) and issubclass(AsyncMPClient, MPClient)
