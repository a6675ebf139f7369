"""Shared fixtures: one tiny model per family, built once per test session."""

from __future__ import annotations

import os

import pytest

from tests.utils import make_tiny_model

TINY_KINDS = ("llama", "mistral", "qwen2", "qwen3")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """`tiny_model_dir(kind)` -> path of a tiny random float32 model of that family."""
    cache: dict[str, str] = {}

    def get(kind: str) -> str:
        if kind not in cache:
            d = tmp_path_factory.mktemp(f"tiny-{kind}")
            cache[kind] = make_tiny_model(kind, str(d))
        return cache[kind]

    return get


@pytest.fixture(scope="session")
def embedded_model_path():
    from vllm.transformers_utils.config import embedded_model_path as path

    p = path()
    if not os.path.isfile(p):
        pytest.fail(f"embedded model missing at {p}: run `make venv`")
    return p
