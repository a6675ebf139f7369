#!/usr/bin/env python
"""Check that .buildkite/test_areas/*.yaml name real test paths and real
source directories, and that every test directory belongs to some area.

Usage: python tools/check_test_areas.py [--list]; exits 1 with the problems.
"""

from __future__ import annotations

import glob
import os
import shlex
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pytest_paths(command: str) -> list[str]:
    words = shlex.split(command)
    if "pytest" not in words:
        return []
    args = words[words.index("pytest") + 1 :]
    return [a.split("::")[0] for a in args if not a.startswith("-")]


def check(root: str = ROOT) -> tuple[list[str], list[str]]:
    """-> (problems, every test path named)."""
    problems, named = [], []
    files = sorted(glob.glob(os.path.join(root, ".buildkite", "test_areas", "*.yaml")))
    if not files:
        problems.append("no .buildkite/test_areas/*.yaml")
    for path in files:
        with open(path) as f:
            area = yaml.safe_load(f)
        rel = os.path.relpath(path, root)
        for step in area.get("steps", []):
            for dep in step.get("source_file_dependencies", []):
                if not os.path.exists(os.path.join(root, dep)):
                    problems.append(f"{rel}: source dependency {dep} does not exist")
            for cmd in step.get("commands", []):
                for p in _pytest_paths(cmd):
                    named.append(p)
                    if not os.path.exists(os.path.join(root, p)):
                        problems.append(f"{rel}: test path {p} does not exist")
    for test_file in glob.glob(os.path.join(root, "tests", "**", "test_*.py"), recursive=True):
        rel = os.path.relpath(test_file, root)
        if not any(rel == p or rel.startswith(p.rstrip("/") + "/") for p in named):
            problems.append(f"{rel} belongs to no test area")
    return problems, named


def main() -> int:
    problems, named = check()
    if "--list" in sys.argv:
        print("\n".join(sorted(set(named))))
    for p in problems:
        print("problem:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
