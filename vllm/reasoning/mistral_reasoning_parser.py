"""Mistral (Magistral) (upstream: vllm/reasoning/mistral_reasoning_parser.py)."""

from __future__ import annotations

from collections.abc import Sequence

from vllm.reasoning.basic_parsers import (
    MARKER_WINDOW_TOKENS,
    BaseThinkingReasoningParser,
    hold_back,
)


class MistralReasoningParser(BaseThinkingReasoningParser):
    """`[THINK]...[/THINK]`, where (unlike `<think>`) the reasoning exists
    only after a `[THINK]` the model emits: text before it, and all text
    of an output without it, is content; a `[/THINK]` without a `[THINK]`
    before it is dropped.

    Upstream requires mistral_common's tokenizer (where the markers are
    special tokens); any tokenizer works here, with the markers as tokens or
    spelled in text. The serving layer must detokenize without skipping
    special tokens for the markers to reach the text.
    """

    @property
    def start_token(self) -> str:
        return "[THINK]"

    @property
    def end_token(self) -> str:
        return "[/THINK]"

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """Whether an end marker follows the last start marker (False
        without a start marker)."""
        if self.start_token_id is not None and self.end_token_id is not None:
            seen_end = False
            for token_id in reversed(input_ids):
                if token_id == self.start_token_id:
                    return seen_end
                seen_end = seen_end or token_id == self.end_token_id
            return False
        text = self._decode(input_ids)
        start = text.rfind(self.start_token)
        return start >= 0 and self.end_token in text[start:]

    def is_reasoning_end_streaming(
        self, input_ids: Sequence[int], delta_ids: Sequence[int]
    ) -> bool:
        """Whether the newest tokens `delta_ids` end the reasoning: an end
        marker among them, after a start marker anywhere before."""
        if self.end_token_id is not None:
            return self.end_token_id in delta_ids and self.is_reasoning_end(input_ids)
        window = input_ids[-(len(delta_ids) + MARKER_WINDOW_TOKENS) :]
        return self.end_token in self._decode(window) and self.is_reasoning_end(input_ids)

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        """The ids of the content: before the first start marker and after the
        end marker that follows it (ids of a marker spelled in pieces are
        kept in the part before it)."""
        start = self._index_completing(input_ids, self.start_token, self.start_token_id)
        end = self._index_completing(input_ids, self.end_token, self.end_token_id)
        if start < 0:
            return input_ids if end < 0 else input_ids[:end] + input_ids[end + 1 :]
        if end < start:
            return input_ids[:start]
        return input_ids[:start] + input_ids[end + 1 :]

    def _split(self, text: str, final: bool) -> tuple[str | None, str | None]:
        start, end = self.start_token, self.end_token
        start_index = text.find(start)
        if start_index < 0:
            visible = text if final else hold_back(text, [start, end])
            return None, visible.replace(end, "", 1)
        before = text[:start_index].replace(end, "", 1)
        after = text[start_index + len(start) :]
        end_index = after.find(end)
        if end_index >= 0:
            content = before + after[end_index + len(end) :]
            return after[:end_index], content or None
        return (after if final else hold_back(after, [end])), before or None
