"""Where the engine was started from (upstream: vllm/usage/usage_lib.py).

Upstream also collects anonymous usage statistics here; this project sends
nothing anywhere and keeps only the enum, which picks start-up defaults
(e.g. the token budget differs between the `LLM` class and the server).
"""

from enum import Enum


class UsageContext(str, Enum):
    UNKNOWN_CONTEXT = "UNKNOWN_CONTEXT"
    LLM_CLASS = "LLM_CLASS"
    API_SERVER = "API_SERVER"
    OPENAI_API_SERVER = "OPENAI_API_SERVER"
    OPENAI_BATCH_RUNNER = "OPENAI_BATCH_RUNNER"
    ENGINE_CONTEXT = "ENGINE_CONTEXT"
