"""A `--reasoning-parser-plugin` file for the tests: registers the reasoning
parser "marker_think": the reasoning is the text before the first `=>`, the
content what follows it (no `=>`: all of it is reasoning, as a model cut off
while thinking). Found by text, so any tokenizer works."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.openai.protocol import DeltaMessage
from vllm.reasoning import ReasoningParser, ReasoningParserManager

END = "=>"


@ReasoningParserManager.register_module("marker_think")
class MarkerReasoningParser(ReasoningParser):
    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        kwargs = kwargs.get("chat_template_kwargs") or {}
        self.thinking = kwargs.get("enable_thinking", True)
        self.reasoning_sent = 0  # characters of reasoning streamed so far

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        return not self.thinking or END in self.model_tokenizer.decode(list(input_ids))

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        return input_ids if not self.thinking else []

    def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
        if not self.thinking:
            return None, model_output
        reasoning, sep, content = model_output.partition(END)
        return reasoning or None, (content or None) if sep else None

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        if not self.thinking or END in previous_text:
            return DeltaMessage(content=delta_text)
        reasoning, sep, content = current_text.partition(END)
        if not sep and reasoning.endswith(END[0]):
            reasoning = reasoning[:-1]  # maybe the marker's start: held back
        new, self.reasoning_sent = reasoning[self.reasoning_sent :], len(reasoning)
        if not (new or content):
            return None
        return DeltaMessage(reasoning=new or None, content=content or None)
