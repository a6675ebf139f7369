"""The import-layer contracts of .importlinter hold, each one can fail, and the
only import cycles among vllm/ modules are the ones listed there with a reason.

`lint-imports` (import-linter) checks the contracts; it sees function-level and
`if TYPE_CHECKING:` imports too. To show a contract is not vacuous, the package
is copied to a temporary directory, one forbidden import is added to the copy,
and lint-imports must report that contract broken.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys

import grimp
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, ".importlinter")
# The venv's console script (import-linter is in the `test` extra), else the one on PATH.
LINT_IMPORTS = next(
    (
        p
        for p in (
            os.path.join(os.path.dirname(sys.executable), "lint-imports"),
            shutil.which("lint-imports"),
        )
        if p and os.path.exists(p)
    ),
    "lint-imports",
)

# contract id -> (file of the copy to change, the forbidden import added to it). The config
# case adds its import inside a function: lazy imports are layer edges too.
VIOLATIONS = {
    "v1-runner-not-v2": ("vllm/v1/worker/gpu_input_batch.py", "import vllm.v1.worker.gpu.states\n"),
    "v2-not-v1-runner": ("vllm/v1/worker/gpu/states.py", "import vllm.v1.worker.gpu_input_batch\n"),
    "shared-worker-modules": (
        "vllm/v1/worker/cudagraph_padding.py",
        "import vllm.v1.worker.gpu_model_runner\n",
    ),
    "config-below-v1": (
        "vllm/config/scheduler.py",
        (
            "\n\ndef _resolve():\n"
            "    from vllm.v1.core.sched.scheduler import Scheduler\n"
            "    return Scheduler\n"
        ),
    ),
}


def _config() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(CONFIG)
    return parser


def _lint_imports(cwd: str) -> subprocess.CompletedProcess:
    # lint-imports finds `vllm` on sys.path, which starts with its working directory.
    env = dict(os.environ, PYTHONPATH=cwd)
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", "--config", ".importlinter"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_contracts_are_kept():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_every_contract_has_a_violation_case():
    contracts = {
        name.removeprefix("importlinter:contract:")
        for name in _config().sections()
        if name.startswith("importlinter:contract:")
    }
    assert contracts == set(VIOLATIONS)


# Modules of vllm/v1/worker/ above both runners (they pick one, or serve whichever runs).
WORKER_LEVEL = {"gpu_worker", "worker_base", "worker_sleep"}


def test_every_worker_module_is_placed_in_a_layer():
    """A new file in vllm/v1/worker/ is a V1 runner part, a shared module or
    worker-level, and the contracts must say which (V2 is the gpu/ package)."""
    config = _config()
    runner = set(config["importlinter:contract:v1-runner-not-v2"]["source_modules"].split())
    shared = set(config["importlinter:contract:shared-worker-modules"]["source_modules"].split())
    assert runner == set(
        config["importlinter:contract:v2-not-v1-runner"]["forbidden_modules"].split()
    )
    assert runner | {"vllm.v1.worker.gpu"} == set(
        config["importlinter:contract:shared-worker-modules"]["forbidden_modules"].split()
    )
    worker_dir = os.path.join(ROOT, "vllm", "v1", "worker")
    unplaced = [
        name
        for name in sorted(os.listdir(worker_dir))
        if name.endswith(".py")
        and name != "__init__.py"
        and name[:-3] not in WORKER_LEVEL
        and f"vllm.v1.worker.{name[:-3]}" not in runner | shared
    ]
    assert not unplaced, f"add these to a contract in .importlinter: {unplaced}"


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("layers"))
    shutil.copytree(
        os.path.join(ROOT, "vllm"),
        os.path.join(root, "vllm"),
        ignore=shutil.ignore_patterns("__pycache__", "*.so"),
    )
    shutil.copy(CONFIG, os.path.join(root, ".importlinter"))
    return root


@pytest.mark.parametrize("contract", sorted(VIOLATIONS))
def test_contract_fails_on_a_forbidden_import(package_copy, contract):
    path, line = VIOLATIONS[contract]
    target = os.path.join(package_copy, path)
    with open(target) as f:
        original = f.read()
    try:
        with open(target, "a") as f:
            f.write(line)
        result = _lint_imports(package_copy)
    finally:
        with open(target, "w") as f:
            f.write(original)
    assert result.returncode != 0, result.stdout
    name = _config()[f"importlinter:contract:{contract}"]["name"]
    assert f"{name} BROKEN" in result.stdout, result.stdout
    assert "1 broken" in result.stdout, result.stdout


def _import_cycles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """The strongly connected components (more than one module) of a module
    import graph: Tarjan's algorithm, iterative."""
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges[child])))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(frozenset(component))
    return cycles


def test_only_listed_import_cycles():
    listed = {}
    for key, value in _config()["vllm:import_cycles"].items():
        modules, _, reason = value.partition(":")
        assert reason.strip(), f"import cycle {key} has no reason"
        listed[frozenset(modules.split())] = key
    found = set(_import_cycles(grimp.build_graph("vllm", cache_dir=None)))
    unlisted = [sorted(c) for c in found - set(listed)]
    stale = [listed[c] for c in set(listed) - found]
    assert not unlisted, f"import cycles not listed in .importlinter: {unlisted}"
    assert not stale, f"listed import cycles that no longer exist: {stale}"


def test_cycle_finder_sees_a_new_cycle():
    graph = grimp.ImportGraph()
    for importer, imported in [
        ("p.a", "p.b"),
        ("p.b", "p.c"),
        ("p.c", "p.a"),
        ("p.c", "p.d"),
        ("p.d", "p.e"),
        ("p.e", "p.d"),
        ("p.f", "p.a"),
    ]:
        graph.add_import(importer=importer, imported=imported)
    assert sorted(map(sorted, _import_cycles(graph))) == [["p.a", "p.b", "p.c"], ["p.d", "p.e"]]
