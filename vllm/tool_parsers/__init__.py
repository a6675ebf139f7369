"""Tool parsers for `tool_choice: "auto"` (upstream: vllm/tool_parsers/).

`--tool-call-parser NAME` picks one of the names registered below (each module
is imported on first use); `--tool-parser-plugin FILE` adds more. The contract
every parser keeps is in abstract_tool_parser.py.
"""

from vllm.tool_parsers.abstract_tool_parser import ToolParser, ToolParserManager

__all__ = ["ToolParser", "ToolParserManager"]

# name -> (module in this package, class), as upstream names them.
_BUILTIN_TOOL_PARSERS = {
    "hermes": ("hermes_tool_parser", "Hermes2ProToolParser"),
    "llama3_json": ("llama_tool_parser", "Llama3JsonToolParser"),
    "llama4_json": ("llama_tool_parser", "Llama3JsonToolParser"),
    "mistral": ("mistral_tool_parser", "MistralToolParser"),
    "pythonic": ("pythonic_tool_parser", "PythonicToolParser"),
    "qwen3_xml": ("qwen3xml_tool_parser", "Qwen3XMLToolParser"),
    "qwen3_coder": ("qwen3coder_tool_parser", "Qwen3CoderToolParser"),
    "deepseek_v3": ("deepseekv3_tool_parser", "DeepSeekV3ToolParser"),
    "granite": ("granite_tool_parser", "GraniteToolParser"),
}

for _name, (_module, _cls) in _BUILTIN_TOOL_PARSERS.items():
    ToolParserManager.register_lazy_module(_name, f"vllm.tool_parsers.{_module}", _cls)
