"""The operator routes of `vllm serve`, registered only under
VLLM_SERVER_DEV_MODE=1 (upstream: vllm/entrypoints/serve/dev/): sleep mode
(`sleep/`: /sleep, /wake_up, /is_sleeping), the prefix cache (`cache/`:
/reset_prefix_cache) and worker RPC (`rpc/`: /collective_rpc, refused here).

They change the state of the whole engine, so they must never be reachable
by the public: like every route but /health, /ping, /version and the docs,
they sit behind `--api-key` when one is set.
"""

from __future__ import annotations

from fastapi import FastAPI

import vllm.envs as envs


def register_dev_api_routers(app: FastAPI) -> None:
    """Attach the operator routes when VLLM_SERVER_DEV_MODE=1."""
    if not envs.VLLM_SERVER_DEV_MODE:
        return
    from vllm.entrypoints.serve.dev.cache.api_router import router as cache_router
    from vllm.entrypoints.serve.dev.rpc.api_router import router as rpc_router
    from vllm.entrypoints.serve.dev.sleep.api_router import router as sleep_router

    for router in (sleep_router, cache_router, rpc_router):
        app.include_router(router)
