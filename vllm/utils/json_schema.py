"""The depth guard on JSON schemas (structured outputs), a leaf module: both
`SamplingParams` validation (vllm/sampling_params.py) and the xgrammar backend
(vllm/v1/structured_output/) use it, and the former must not import the latter.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# Deepest JSON schema accepted (containers, counted as JSON nesting). xgrammar's
# schema conversion time grows about with the cube of the depth (0.2 s at 200
# levels, 18 s at 800 on a loaded 2-core machine, in the request's path), and
# copying a schema thousands of levels deep exhausts Python's recursion limit.
# Real schemas stay far below: each property nesting is two levels.
MAX_JSON_SCHEMA_DEPTH = 128


def check_json_schema_depth(schema: Any, limit: int = MAX_JSON_SCHEMA_DEPTH) -> None:
    """ValueError if `schema` (parsed JSON) nests deeper than `limit`.
    Iterative: it must not recurse on the input it is guarding against."""
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        if depth > limit:
            raise ValueError(f"The JSON schema is nested more than {limit} levels deep.")
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
