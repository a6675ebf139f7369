"""Argument-parsing helpers (upstream: vllm/utils/argparse_utils.py)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from typing import Any

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(value: str) -> int:
    """Parse '32k' (32,000), '32K' (32,768), '25.6k' (25,600) or a plain int.

    Lower-case suffixes are decimal, upper-case ones binary; a decimal number
    with a binary suffix is ambiguous and rejected, as upstream does.
    """
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if match is None:
        return int(value)
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError(
            f"Decimals are not allowed with binary suffixes like {suffix}. "
            f"Did you mean to use {number}{suffix.lower()} instead?"
        )
    return int(number) * _BINARY[suffix]


def human_readable_int_or_auto(value: str) -> int:
    """Like `human_readable_int`, plus "auto" / "-1" meaning -1 (fit the KV cache)."""
    if value.strip().lower() in ("auto", "-1"):
        return -1
    return human_readable_int(value)


def optional_type(parse: Any):
    """Wrap a parser so that "None"/"null" (any case) or "" parse to None."""

    def parse_optional(value: str) -> Any:
        if value == "" or value.lower() in ("none", "null"):
            return None
        return parse(value)

    parse_optional.__name__ = getattr(parse, "__name__", "optional")
    return parse_optional


def json_dict(value: str) -> dict[str, Any]:
    """Parse a JSON object given on the command line."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {value!r} ({e})") from e
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {value!r}")
    return parsed


def field_arg(
    default: Any,
    help: str,
    group: str,
    *,
    type: Any = None,
    choices: Any = None,
    aliases: tuple[str, ...] = (),
    nargs: str | None = None,
) -> Any:
    """A dataclass field that also describes its command-line flag (read by
    `add_field_flag`): help text, argparse group, value parser, choices,
    aliases such as "-tp", nargs."""
    meta = {
        "help": help,
        "group": group,
        "type": type,
        "choices": choices,
        "aliases": aliases,
        "nargs": nargs,
    }
    return dataclasses.field(default=default, metadata=meta)


def add_field_flag(group: Any, f: dataclasses.Field, meta: Any) -> None:
    """`--kebab-case` flag for the field `f`; booleans get `--no-...` too."""
    flag = "--" + f.name.replace("_", "-")
    names = [flag, *meta["aliases"]]
    kwargs: dict[str, Any] = {"dest": f.name, "default": f.default, "help": meta["help"]}
    if isinstance(f.default, bool) or f.type in ("bool", "bool | None"):
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        parse = meta["type"]
        if parse is None:
            parse = type(f.default) if f.default is not None else str
        kwargs["type"] = parse
        if meta["choices"] is not None:
            kwargs["choices"] = meta["choices"]
        if meta["nargs"] is not None:
            kwargs["nargs"] = meta["nargs"]
    group.add_argument(*names, **kwargs)


class FlexibleArgumentParser(argparse.ArgumentParser):
    """ArgumentParser that also accepts `--snake_case` spellings of flags.

    Upstream's parser does the same so that `--max_model_len 128` works like
    `--max-model-len 128`; values after `=` are left untouched.
    (`parse_args` goes through `parse_known_args`, so both are covered.)
    """

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        raw = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(self._normalize(raw), namespace)

    @staticmethod
    def _normalize(args: list[str]) -> list[str]:
        out = []
        for arg in args:
            if arg.startswith("--") and not arg.startswith("---"):
                name, eq, rest = arg.partition("=")
                arg = name.replace("_", "-") + eq + rest
            out.append(arg)
        return out
