"""The registry behind `--reasoning-parser`: built-in names, the error for an
unknown one, and plugin files (`--reasoning-parser-plugin`)."""

from __future__ import annotations

import pytest

from tests.reasoning.utils import TOKENIZERS
from vllm.reasoning import ReasoningParser, ReasoningParserManager

BUILTINS = {
    "deepseek_r1": "DeepSeekR1ReasoningParser",
    "qwen3": "Qwen3ReasoningParser",
    "granite": "GraniteReasoningParser",
    "mistral": "MistralReasoningParser",
}


@pytest.mark.parametrize("name", list(BUILTINS))
def test_builtin_parsers_resolve_to_upstream_classes(name):
    cls = ReasoningParserManager.get_reasoning_parser(name)
    assert cls.__name__ == BUILTINS[name] and issubclass(cls, ReasoningParser)
    assert cls.__module__ == f"vllm.reasoning.{name}_reasoning_parser"
    assert isinstance(cls(TOKENIZERS["plain"]()), ReasoningParser)


def test_unknown_name_lists_the_parsers():
    with pytest.raises(KeyError) as info:
        ReasoningParserManager.get_reasoning_parser("no_such_parser")
    message = str(info.value)
    assert "no_such_parser" in message
    assert all(name in message for name in BUILTINS)


def test_plugin_file_registers_its_parser(tmp_path):
    plugin = tmp_path / "my_reasoning_plugin.py"
    plugin.write_text(
        "from vllm.reasoning import ReasoningParserManager\n"
        "from vllm.reasoning.basic_parsers import BaseThinkingReasoningParser\n\n"
        "@ReasoningParserManager.register_module('test_plugin_reasoner')\n"
        "class SeedThink(BaseThinkingReasoningParser):\n"
        "    start_token = '<seed:think>'\n"
        "    end_token = '</seed:think>'\n"
    )
    try:
        ReasoningParserManager.import_reasoning_parser(str(plugin))
        assert "test_plugin_reasoner" in ReasoningParserManager.list_registered()
        parser = ReasoningParserManager.get_reasoning_parser("test_plugin_reasoner")(
            TOKENIZERS["plain"]()
        )
        output = "<seed:think>hmm</seed:think>ok"
        assert parser.extract_reasoning(output, request=None) == ("hmm", "ok")
    finally:
        ReasoningParserManager.reasoning_parsers.pop("test_plugin_reasoner", None)
