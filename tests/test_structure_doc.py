"""docs/structure.md is a map: every hop it names (`path.py:function` or
`path.py:Class.method`) must exist, and so must every path it names.
csrc/README.md is held to the tree the same way: the source files it names
exist and the ops it lists are registered by the bindings.

A hop's file is parsed (never imported) and searched for the definition:
module-level functions and classes, and methods (or nested classes) of a
class, including names assigned in a class body or a module.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "structure.md"
CSRC = ROOT / "csrc"

# A backticked span; hops and paths are found among them.
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_HOP = re.compile(r"^([\w./-]+\.py):([A-Za-z_][\w.]*)$")
# Paths: a span that starts with one of the tree's top-level entries.
_PATH_PREFIXES = (
    "vllm/",
    "tests/",
    "csrc/",
    "tools/",
    "benchmarks/",
    "docs/",
    ".buildkite/",
    "examples/",
)


def _spans() -> list[str]:
    return _CODE_SPAN.findall(DOC.read_text())


def _hops() -> list[tuple[str, str]]:
    return sorted({m.groups() for s in _spans() if (m := _HOP.match(s))})


def _paths() -> list[str]:
    return sorted(
        {s for s in _spans() if s.startswith(_PATH_PREFIXES) and " " not in s and not _HOP.match(s)}
    )


def _defined_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body defines, mapped to their nodes."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return names


@cache
def _module(path: str) -> ast.Module:
    return ast.parse((ROOT / path).read_text(), filename=path)


def _resolve(path: str, dotted: str) -> bool:
    scope: ast.AST = _module(path)
    for part in dotted.split("."):
        if not isinstance(scope, (ast.Module, ast.ClassDef)):
            return False
        found = _defined_names(scope.body).get(part)
        if found is None:
            return False
        scope = found
    return True


def test_doc_names_hops_and_paths() -> None:
    # The parsers below must see the doc's content, or the checks prove nothing.
    assert len(_hops()) >= 50
    assert len(_paths()) >= 20


@pytest.mark.parametrize(("path", "name"), _hops(), ids=lambda v: v)
def test_hop_exists(path: str, name: str) -> None:
    assert (ROOT / path).is_file(), f"{path} (hop {path}:{name}) does not exist"
    assert _resolve(path, name), f"{path} does not define {name}"


@pytest.mark.parametrize("path", _paths())
def test_path_exists(path: str) -> None:
    assert (ROOT / path.rstrip("/")).exists(), f"docs/structure.md names {path}, which is missing"


def test_resolver_rejects_missing_names() -> None:
    # The check can fail: a wrong method, class or function is reported.
    assert _resolve("vllm/v1/engine/engine_core.py", "EngineCore.step")
    assert not _resolve("vllm/v1/engine/engine_core.py", "EngineCore.no_such_method")
    assert not _resolve("vllm/v1/engine/engine_core.py", "NoSuchClass")
    assert not _resolve("vllm/v1/engine/engine_core.py", "EngineCore.step.inner")


# ---- csrc/README.md ------------------------------------------------------------------
_SOURCE_FILE = re.compile(r"^[\w./-]+\.(?:cu|cuh|cpp|h|py|sh|txt)$")
_CUDA_OP = re.compile(r"^(_C|_C_cache_ops)\.(\w+)$")
_BINDING_DEF = re.compile(r'm\.def\("(\w+)\(')


def _csrc_spans() -> list[str]:
    return sorted(set(_CODE_SPAN.findall((CSRC / "README.md").read_text())))


def _registered_ops(bindings: Path) -> set[str]:
    return set(_BINDING_DEF.findall(bindings.read_text()))


@pytest.mark.parametrize("name", [s for s in _csrc_spans() if _SOURCE_FILE.match(s)])
def test_csrc_readme_file_exists(name: str) -> None:
    # Names are relative to csrc/ or to the repository root; a bare file name
    # (`cpu_attn.py`, `benchmark_cpu_ops.py`) is looked up anywhere below them.
    found = (
        (CSRC / name).exists()
        or (ROOT / name).exists()
        or (
            "/" not in name and any((ROOT / top).rglob(name))
            for top in ("csrc", "vllm", "benchmarks")
        )
    )
    assert found, f"csrc/README.md names {name}, which is missing"


def test_csrc_readme_ops_are_registered() -> None:
    cuda_ops = _registered_ops(CSRC / "torch_bindings.cpp")
    named = [m.group(2) for s in _csrc_spans() if (m := _CUDA_OP.match(s))]
    assert len(named) >= 7
    assert set(named) <= cuda_ops, set(named) - cuda_ops
    # The first column of the CPU ops table: each op is a `_C_cpu` op.
    text = (CSRC / "README.md").read_text()
    table = text.split("## CPU ops (`cpu/`)", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in table.splitlines() if line.startswith("| `")]
    cpu_named = {op for cell in rows for op in _CODE_SPAN.findall(cell)}
    cpu_ops = _registered_ops(CSRC / "cpu" / "torch_bindings.cpp")
    assert len(cpu_named) >= 6
    assert cpu_named <= cpu_ops, cpu_named - cpu_ops
