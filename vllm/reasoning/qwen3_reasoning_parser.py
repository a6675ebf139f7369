"""Qwen3 (upstream: vllm/reasoning/qwen3_reasoning_parser.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vllm.reasoning.basic_parsers import (
    MARKER_WINDOW_TOKENS,
    BaseThinkingReasoningParser,
    hold_back,
)

if TYPE_CHECKING:
    from vllm.tokenizers.protocol import TokenizerLike

TOOL_CALL_TAG = "<tool_call>"
TOOL_CALL_END_TAG = "</tool_call>"
FUNCTION_TAG = "<function"
# What must follow `<tool_call>` (after whitespace) for it to end the reasoning.
_FUNCTION_OPEN = re.compile(r"<function[\s=]")


class Qwen3ReasoningParser(BaseThinkingReasoningParser):
    """`<think>...</think>`, with Qwen3's two switches:

    - `chat_template_kwargs={"enable_thinking": False}` (given to the
      constructor as upstream's serving layer does): the template closes an
      empty think block in the prompt, so the whole output is content and the
      reasoning counts as ended from the first token (a grammar applies
      there). Upstream still splits at a `</think>` the model emits anyway;
      here it stays content, so that streaming cannot disagree.
    - thinking on (default): as deepseek_r1, and a `<tool_call>` followed by
      `<function...` ends the reasoning even without `</think>` (Qwen3.5
      models call tools from inside the think block); the call is content.
    """

    def __init__(self, tokenizer: TokenizerLike, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        chat_kwargs = kwargs.get("chat_template_kwargs") or {}
        self.thinking_enabled = bool(chat_kwargs.get("enable_thinking", True))

    @property
    def start_token(self) -> str:
        return "<think>"

    @property
    def end_token(self) -> str:
        return "</think>"

    # ---- ids ---------------------------------------------------------------------
    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        if not self.thinking_enabled or super().is_reasoning_end(input_ids):
            return True
        return self._tool_call_ends(self._decode(input_ids[-4 * MARKER_WINDOW_TOKENS :]))

    def is_reasoning_end_streaming(
        self, input_ids: Sequence[int], delta_ids: Sequence[int]
    ) -> bool:
        if not self.thinking_enabled or super().is_reasoning_end_streaming(input_ids, delta_ids):
            return True
        window = self._decode(input_ids[-(len(delta_ids) + MARKER_WINDOW_TOKENS) :])
        return self._tool_call_ends(window)

    def _tool_call_ends(self, text: str) -> bool:
        """Whether `text` (the newest tokens) has a `<tool_call>` that opens a
        function after the last think marker and is not closed yet (a closed
        one is a call from the chat history, as upstream skips it)."""
        tail = text[max(text.rfind(self.start_token), text.rfind(self.end_token), 0) :]
        return any(
            _FUNCTION_OPEN.match(tail[m.end() :].lstrip())
            and TOOL_CALL_END_TAG not in tail[m.end() :]
            for m in re.finditer(re.escape(TOOL_CALL_TAG), tail)
        )

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        if not self.thinking_enabled:
            return input_ids
        return super().extract_content_ids(input_ids)

    # ---- text --------------------------------------------------------------------
    def _split(self, text: str, final: bool) -> tuple[str | None, str | None]:
        if not self.thinking_enabled:
            return None, text
        reasoning, content = super()._split(text, final)
        assert reasoning is not None
        still_open = content is None and self.end_token not in text
        # The first <tool_call> that opens a function ends the reasoning, even
        # before a `</think>` (which is then part of the content).
        search_from = 0
        while (index := reasoning.find(TOOL_CALL_TAG, search_from)) >= 0:
            after = reasoning[index + len(TOOL_CALL_TAG) :]
            if _FUNCTION_OPEN.match(after.lstrip()):
                rest = reasoning[index:]
                if not still_open:
                    rest += self.end_token + (content or "")
                return reasoning[:index] or None, rest
            if not final and still_open and FUNCTION_TAG.startswith(after.lstrip()):
                return reasoning[:index], None  # "<function" may still follow
            search_from = index + 1
        if not final and still_open:
            reasoning = hold_back(reasoning, [TOOL_CALL_TAG])
        return reasoning, content
