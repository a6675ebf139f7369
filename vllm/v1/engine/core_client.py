"""The engine-core clients at upstream's import path (vllm/v1/engine/core_client.py).

Upstream keeps every client in this module; here they are in two:

    EngineCoreClient, InprocClient           core_client_base.py
    MPClient, SyncMPClient, AsyncMPClient    core_client_mp.py
    DPAsyncMPClient, DPLBAsyncMPClient       core_client_dp.py

This module only re-exports them, so that upstream's imports work. Nothing
under vllm/ imports from here (the client modules import each other), which
keeps this module out of the import cycle of the factory.
"""

from vllm.v1.engine.core_client_base import EngineCoreClient, InprocClient
from vllm.v1.engine.core_client_dp import DPAsyncMPClient, DPLBAsyncMPClient
from vllm.v1.engine.core_client_mp import AsyncMPClient, MPClient, SyncMPClient

__all__ = [
    "AsyncMPClient",
    "DPAsyncMPClient",
    "DPLBAsyncMPClient",
    "EngineCoreClient",
    "InprocClient",
    "MPClient",
    "SyncMPClient",
]
