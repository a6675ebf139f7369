"""Running the ASGI app under uvicorn (upstream: vllm/entrypoints/launcher.py).

Shutdown paths:
* SIGTERM / SIGINT: uvicorn stops accepting connections, lets in-flight
  requests run for `--shutdown-timeout` seconds, cancels the rest (which
  aborts them in the engine), runs the lifespan shutdown; the caller then
  shuts the engine down, and its process exits.
* Engine death: the watchdog (or the first request that hits it) stops the
  server, unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1 keeps it answering 503/500.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

import vllm.envs as envs
from vllm.engine.protocol import EngineClient
from vllm.logger import init_logger

logger = init_logger(__name__)

# Seconds between two checks of the engine's health.
WATCHDOG_INTERVAL_S = 5.0


async def serve_http(app: FastAPI, sock: socket.socket | None, **uvicorn_kwargs: Any) -> None:
    """Serve `app` until a signal or the engine's death stops it."""
    config = uvicorn.Config(app, **uvicorn_kwargs)
    server = uvicorn.Server(config)
    app.state.server = server
    watchdog = asyncio.get_running_loop().create_task(
        watchdog_loop(server, app.state.engine_client)
    )
    # uvicorn re-raises the signal that stopped it once it is done, under the
    # handler that was installed before: make that a no-op so that the engine
    # is shut down and the process exits normally afterwards.
    previous = {
        sig: signal.signal(sig, _ignore_late_signal) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        await server.serve(sockets=[sock] if sock is not None else None)
    finally:
        watchdog.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    logger.info("HTTP server stopped.")


def _ignore_late_signal(signum: int, frame: Any) -> None:
    logger.debug("Signal %d received after the server stopped.", signum)


async def watchdog_loop(server: uvicorn.Server, engine: EngineClient) -> None:
    """Stop the server once the engine has died."""
    while True:
        await asyncio.sleep(WATCHDOG_INTERVAL_S)
        terminate_if_errored(server, engine)


def terminate_if_errored(server: uvicorn.Server, engine: EngineClient) -> None:
    """Ask the server to exit if the engine errored (and keep-alive is off)."""
    if engine.errored and not envs.VLLM_KEEP_ALIVE_ON_ENGINE_DEATH and not server.should_exit:
        logger.fatal("The engine is dead: shutting down the API server.")
        server.should_exit = True
