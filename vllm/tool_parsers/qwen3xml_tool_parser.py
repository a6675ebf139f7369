"""Qwen3 XML tool calls (upstream: vllm/tool_parsers/qwen3xml_tool_parser.py).

The same format as qwen3_coder (`<tool_call><function=NAME><parameter=P>VALUE
</parameter></function></tool_call>`, parameter values converted by the
tool's JSON schema); upstream reads it with a streaming XML parser, this one
with the same snapshot parser as Qwen3CoderToolParser, whose outputs upstream's
shared tests hold to be the same.
"""

from __future__ import annotations

from vllm.tool_parsers.qwen3coder_tool_parser import Qwen3CoderToolParser


class Qwen3XMLToolParser(Qwen3CoderToolParser):
    """`--tool-call-parser qwen3_xml`."""
