"""DeepSeek R1 (upstream: vllm/reasoning/deepseek_r1_reasoning_parser.py)."""

from __future__ import annotations

from vllm.reasoning.basic_parsers import BaseThinkingReasoningParser


class DeepSeekR1ReasoningParser(BaseThinkingReasoningParser):
    """`<think>...</think>`; R1's chat template ends the prompt with
    `<think>\\n`, so the output usually has only the end marker, and an
    output without one is all reasoning (cut off while thinking)."""

    @property
    def start_token(self) -> str:
        return "<think>"

    @property
    def end_token(self) -> str:
        return "</think>"
