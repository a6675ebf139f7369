"""DeepSeek-V3 tool calls (upstream: vllm/tool_parsers/deepseekv3_tool_parser.py).

    content<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {...}
    ```<｜tool▁call▁end｜>...more calls...<｜tool▁calls▁end｜>

The markers are found in the text, so a tokenizer without them as special
tokens works too. As upstream: content is the text before the calls block,
text after it is dropped, a call's type must be `function`. Arguments are
re-serialized JSON (a cut-off object is completed). A call that does not
parse is skipped; a calls block with no call in it is content, and an output
with no call is all content (`tools_called` False).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vllm.tool_parsers._snapshot_stream import (
    CallSnapshot,
    Snapshot,
    SnapshotStreamer,
    cached_vocab,
    json_arguments,
    to_extracted,
)
from vllm.tool_parsers.abstract_tool_parser import ToolParser
from vllm.tool_parsers.utils import partial_marker_len

if TYPE_CHECKING:
    from vllm.entrypoints.openai.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.protocol_responses import (
        DeltaMessage,
        ExtractedToolCallInformation,
    )
    from vllm.tokenizers.protocol import TokenizerLike

_FENCE_OPEN = re.compile(r"\s*```(?:json)?\s*\n")
_FENCE_CLOSE = "```"


class DeepSeekV3ToolParser(ToolParser):
    """`--tool-call-parser deepseek_v3`."""

    tool_calls_start_token = "<｜tool▁calls▁begin｜>"
    tool_calls_end_token = "<｜tool▁calls▁end｜>"
    tool_call_start_token = "<｜tool▁call▁begin｜>"
    tool_call_end_token = "<｜tool▁call▁end｜>"
    tool_sep_token = "<｜tool▁sep｜>"

    def __init__(self, tokenizer: TokenizerLike) -> None:
        super().__init__(tokenizer)
        self.tool_calls_start_token_id = cached_vocab(tokenizer).get(self.tool_calls_start_token)
        self.tool_calls_end_token_id = cached_vocab(tokenizer).get(self.tool_calls_end_token)
        self.tool_call_start_token_id = cached_vocab(tokenizer).get(self.tool_call_start_token)
        self.tool_call_end_token_id = cached_vocab(tokenizer).get(self.tool_call_end_token)
        self._streamer = SnapshotStreamer()
        self._markers = (
            _FENCE_CLOSE,
            self.tool_call_start_token,
            self.tool_call_end_token,
            self.tool_calls_end_token,
        )

    def adjust_request(self, request: ChatCompletionRequest) -> ChatCompletionRequest:
        # The call markers are special tokens: keep them in the text.
        if request.tools and request.tool_choice != "none":
            request.skip_special_tokens = False
        return request

    def snapshot(self, text: str, final: bool) -> Snapshot:
        """Content and calls of `text`: blocks are read in order; the content
        runs up to the first block that holds a call (or may still)."""
        pos = 0
        while True:
            start = text.find(self.tool_calls_start_token, pos)
            if start < 0:
                if final:
                    return Snapshot(text)
                held = partial_marker_len(text, [self.tool_calls_start_token])
                return Snapshot(text[: len(text) - held])
            body_start = start + len(self.tool_calls_start_token)
            end = text.find(self.tool_calls_end_token, body_start)
            closed = final or end >= 0
            body = text[body_start : end if end >= 0 else len(text)]
            calls = self._block_calls(body, closed)
            if calls or not closed:
                return Snapshot(text[:start], calls)
            if end < 0:
                return Snapshot(text)  # final, and no call anywhere
            pos = end + len(self.tool_calls_end_token)

    def _block_calls(self, body: str, closed: bool) -> list[CallSnapshot]:
        calls = []
        pieces = body.split(self.tool_call_start_token)[1:]
        for i, piece in enumerate(pieces):
            ended = self.tool_call_end_token in piece
            piece = piece.split(self.tool_call_end_token, 1)[0]
            call = self._call(piece, closed or ended or i < len(pieces) - 1)
            if call is not None:
                calls.append(call)
            elif not (closed or ended or i < len(pieces) - 1):
                break  # the last call is still forming
        return calls

    def _call(self, piece: str, closed: bool) -> CallSnapshot | None:
        """`function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```` or None."""
        if self.tool_sep_token not in piece:
            return None
        kind, rest = piece.split(self.tool_sep_token, 1)
        newline = rest.find("\n")
        if kind.strip() != "function" or newline < 0:
            return None
        name = rest[:newline].strip()
        fence = _FENCE_OPEN.match(rest, newline)
        if not name or fence is None:
            return None
        raw = rest[fence.end() :]
        close = raw.find(_FENCE_CLOSE)
        if close >= 0:
            raw, closed = raw[:close], True
        elif not closed:  # hold back what may be the start of a marker
            raw = raw[: len(raw) - partial_marker_len(raw, self._markers)]
        args = json_arguments(raw, closed)
        if args is None:
            return None
        return CallSnapshot(name, args[0], args[1])

    def extract_tool_calls(
        self, model_output: str, request: ChatCompletionRequest
    ) -> ExtractedToolCallInformation:
        return to_extracted(self.snapshot(model_output, final=True), model_output)

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: ChatCompletionRequest,
    ) -> DeltaMessage | None:
        return self._streamer.step(self, self.snapshot(current_text, final=False))

    def finish_streaming(
        self, current_text: str, request: ChatCompletionRequest
    ) -> DeltaMessage | None:
        """What the stream still owes once the output is complete (called by
        utils.flush_tool_call_stream)."""
        return self._streamer.finish(self, self.snapshot(current_text, final=True), current_text)
