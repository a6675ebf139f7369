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
    # The reasoning parser whose reasoning section is left unconstrained ("" = none).
    reasoning_parser: str = ""
    # Constrain the reasoning section too.
    enable_in_reasoning: bool = False

    def __post_init__(self) -> None:
        verify_backend_name(self.backend)
        if self.reasoning_parser:
            raise ValueError(
                f"structured_outputs_config.reasoning_parser={self.reasoning_parser!r} is not "
                "built yet: this build has no reasoning parsers, so the reasoning section "
                "could not be told apart from the constrained output."
            )
        if self.enable_in_reasoning:
            raise ValueError(
                "structured_outputs_config.enable_in_reasoning=True needs a reasoning "
                "parser, and reasoning parsers are not built yet."
            )
