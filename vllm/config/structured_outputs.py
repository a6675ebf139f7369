"""Structured outputs configuration (upstream: vllm/config/structured_outputs.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

StructuredOutputsBackend = Literal["auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"]

# Upstream's backend names, and the ones this implementation builds
# ("auto" resolves to xgrammar).
KNOWN_BACKENDS: tuple[str, ...] = ("auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer")
BUILT_BACKENDS: tuple[str, ...] = ("auto", "xgrammar")


def verify_backend_name(backend: str) -> None:
    """ValueError for a backend this implementation does not build."""
    if backend in BUILT_BACKENDS:
        return
    if backend in KNOWN_BACKENDS:
        raise ValueError(
            f"Structured outputs backend {backend!r} is not built in this "
            "implementation; use 'xgrammar' or 'auto'."
        )
    raise ValueError(
        f"Unknown structured outputs backend {backend!r}; choose one of "
        f"{', '.join(KNOWN_BACKENDS)} ('xgrammar' or 'auto' are built here)."
    )


@dataclass
class StructuredOutputsConfig:
    """Engine-wide defaults of structured outputs (per request:
    `SamplingParams.structured_outputs`)."""

    # Which grammar backend compiles the constraints; "auto" picks xgrammar.
    backend: StructuredOutputsBackend = "auto"
    # Fail a request its backend cannot handle instead of falling back to another.
    disable_fallback: bool = False
    # JSON output without optional whitespace (xgrammar and guidance).
    disable_any_whitespace: bool = False
    # JSON objects without properties beyond the schema's (guidance in upstream;
    # honoured by xgrammar here through its strict mode).
    disable_additional_properties: bool = False
    # The reasoning parser (`--reasoning-parser`, a name in
    # vllm.reasoning.ReasoningParserManager) whose reasoning section is left
    # unconstrained: a request's grammar applies from the first token after
    # the reasoning ends ("" = no parser, the grammar applies from the start).
    reasoning_parser: str = ""
    # A Python file that registers more reasoning parsers
    # (`--reasoning-parser-plugin`); imported where the config is built and
    # again in the engine-core process, which has its own registry.
    reasoning_parser_plugin: str = ""
    # Constrain the reasoning section too (the grammar applies from the start
    # even with a reasoning parser).
    enable_in_reasoning: bool = False

    def __post_init__(self) -> None:
        verify_backend_name(self.backend)
        if self.reasoning_parser:
            verify_reasoning_parser(self.reasoning_parser, self.reasoning_parser_plugin)


def verify_reasoning_parser(name: str, plugin: str = "") -> None:
    """ValueError naming the known parsers when `name` is not one of them
    (after importing `plugin`, which may register it)."""
    from vllm.reasoning import ReasoningParserManager

    if plugin:
        ReasoningParserManager.import_reasoning_parser(plugin)
    if name not in ReasoningParserManager.list_registered():
        raise ValueError(
            f"Unknown reasoning parser {name!r} (structured_outputs_config.reasoning_parser / "
            f"--reasoning-parser); choose one of "
            f"{', '.join(ReasoningParserManager.list_registered())}."
        )
