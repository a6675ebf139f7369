"""IBM Granite 3.x (upstream: vllm/reasoning/granite_reasoning_parser.py)."""

from __future__ import annotations

from collections.abc import Sequence

from vllm.reasoning.basic_parsers import MARKER_WINDOW_TOKENS, TextSplitReasoningParser, hold_back

# Granite writes its sections' headings as plain text; quantized models were
# seen writing "Here's", so both spellings count (as upstream).
THINK_STARTS = ("Here's my thought process:", "Here is my thought process:")
RESPONSE_STARTS = ("Here's my response:", "Here is my response:")


def _first_of(text: str, markers: Sequence[str]) -> tuple[int, str]:
    """(index, marker) of the earliest of `markers` in `text`; (-1, "") if none."""
    found = [(i, m) for m in markers if (i := text.find(m)) >= 0]
    return min(found) if found else (-1, "")


def _last_of(text: str, markers: Sequence[str]) -> int:
    return max(text.rfind(m) for m in markers)


class GraniteReasoningParser(TextSplitReasoningParser):
    """ "Here is my thought process: ... Here is my response: ...".

    An output that does not begin with the thought-process heading is all
    content. After it, the text up to the response heading is reasoning and
    the text after it content. Upstream returns an output with the thought
    heading but no response heading (cut off while thinking) as content,
    while its streaming sends it as reasoning; here both give reasoning.
    """

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """Whether a response heading follows the last thought heading."""
        text = self._decode(input_ids)
        return _last_of(text, RESPONSE_STARTS) > _last_of(text, THINK_STARTS)

    def is_reasoning_end_streaming(
        self, input_ids: Sequence[int], delta_ids: Sequence[int]
    ) -> bool:
        return self.is_reasoning_end(input_ids[-(len(delta_ids) + MARKER_WINDOW_TOKENS) :])

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        """The ids after the response heading ([] without one)."""
        text = self._decode(input_ids)
        index, marker = _first_of(text, RESPONSE_STARTS)
        if index < 0:
            return []
        end = self._index_completing(input_ids, marker, None)
        return input_ids[end + 1 :]

    def _split(self, text: str, final: bool) -> tuple[str | None, str | None]:
        start = next((m for m in THINK_STARTS if text.startswith(m)), None)
        if start is None:
            if not final and any(m.startswith(text) for m in THINK_STARTS):
                return None, None  # the thought heading may still be coming
            return None, text
        body = text[len(start) :]
        index, marker = _first_of(body, RESPONSE_STARTS)
        if index >= 0:
            return body[:index], body[index + len(marker) :] or None
        return (body if final else hold_back(body, RESPONSE_STARTS)), None
