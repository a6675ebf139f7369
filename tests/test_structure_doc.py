"""docs/structure.md is a map: every hop it names (`path.py:function` or
`path.py:Class.method`) must exist, and so must every path it names.

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

# A backticked span; hops and paths are found among them.
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_HOP = re.compile(r"^([\w./-]+\.py):([A-Za-z_][\w.]*)$")
# Paths: a span that starts with one of the tree's top-level entries.
_PATH_PREFIXES = ("vllm/", "tests/", "csrc/", "tools/", "benchmarks/", "docs/", ".buildkite/",
                  "examples/")


def _spans() -> list[str]:
    return _CODE_SPAN.findall(DOC.read_text())


def _hops() -> list[tuple[str, str]]:
    return sorted({m.groups() for s in _spans() if (m := _HOP.match(s))})


def _paths() -> list[str]:
    return sorted({s for s in _spans() if s.startswith(_PATH_PREFIXES) and " " not in s
                   and not _HOP.match(s)})


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
    assert _resolve("vllm/v1/engine/core.py", "EngineCore.step")
    assert not _resolve("vllm/v1/engine/core.py", "EngineCore.no_such_method")
    assert not _resolve("vllm/v1/engine/core.py", "NoSuchClass")
    assert not _resolve("vllm/v1/engine/core.py", "EngineCore.step.inner")
