"""Reasoning parsers (upstream: vllm/reasoning/): `--reasoning-parser NAME`
picks one of the names registered below (each module imported on first use).
The contract is in abs_reasoning_parsers.py."""

from vllm.reasoning.abs_reasoning_parsers import ReasoningParser, ReasoningParserManager

__all__ = ["ReasoningParser", "ReasoningParserManager"]

# name -> (module in this package, class), as upstream names them.
_BUILTIN_REASONING_PARSERS = {
    "deepseek_r1": ("deepseek_r1_reasoning_parser", "DeepSeekR1ReasoningParser"),
    "qwen3": ("qwen3_reasoning_parser", "Qwen3ReasoningParser"),
    "granite": ("granite_reasoning_parser", "GraniteReasoningParser"),
    "mistral": ("mistral_reasoning_parser", "MistralReasoningParser"),
}

for _name, (_module, _cls) in _BUILTIN_REASONING_PARSERS.items():
    ReasoningParserManager.register_lazy_module(_name, f"vllm.reasoning.{_module}", _cls)
