"""The engine core at upstream's import path (vllm/v1/engine/core.py).

Upstream keeps both classes in this module; here each has its own:

    EngineCore       engine_core.py   scheduler + executor, one step at a time
    EngineCoreProc   core_proc.py     EngineCore in its own process, fed over ZMQ

This module only re-exports them (and `get_scheduler_cls`), so that
`from vllm.v1.engine.core import EngineCore, EngineCoreProc` works as
upstream. Nothing under vllm/ imports from here: core_proc.py imports
engine_core.py, which keeps the import graph free of cycles.
"""

from vllm.v1.engine.core_proc import EngineCoreProc
from vllm.v1.engine.engine_core import EngineCore, get_scheduler_cls

__all__ = ["EngineCore", "EngineCoreProc", "get_scheduler_cls"]
