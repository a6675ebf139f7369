"""A real `vllm serve` subprocess on 127.0.0.1 for the server tests
(upstream: tests/utils.py RemoteOpenAIServer)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
# A tiny template: the test tokenizer has none of its own.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SERVER_START_TIMEOUT_S = 180
MAX_MODEL_LEN = 512


def get_open_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RemoteOpenAIServer:
    """`vllm serve` in a subprocess; waits for /health; stops with SIGTERM."""

    def __init__(
        self,
        model: str,
        args: list[str],
        env: dict[str, str] | None = None,
        launcher: list[str] | None = None,
        api_key: str | None = None,
        wait: bool = True,
        log_path: str | None = None,
    ) -> None:
        self.host, self.port = "127.0.0.1", get_open_port()
        self.api_key = api_key
        cmd = launcher or [sys.executable, "-m", "vllm.entrypoints.cli.main"]
        cmd = [
            *cmd,
            "serve",
            model,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--disable-uvicorn-access-log",
            *args,
        ]
        full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})}
        # log_path: the child's stdout and stderr go to that file (to read its log).
        self._log = open(log_path, "ab") if log_path else None  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd,
            env=full_env,
            cwd=REPO_ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT if self._log else None,
        )
        self.ps = psutil.Process(self.proc.pid)
        if wait:
            self.wait_until_healthy()

    @property
    def url_root(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_for(self, *parts: str) -> str:
        return self.url_root + "/" + "/".join(parts)

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_until_healthy(self, timeout: float = SERVER_START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Server exited early with code {self.proc.returncode}")
            try:
                if httpx.get(self.url_for("health"), timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError("Server failed to start in time.")

    def children(self) -> list[psutil.Process]:
        try:
            return self.ps.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def engine_processes(self) -> list[psutil.Process]:
        """The engine-core children (not multiprocessing's resource tracker)."""
        return [p for p in self.children() if "resource_tracker" not in " ".join(p.cmdline())]

    def get_client(self, **kwargs):
        import openai

        return openai.OpenAI(
            base_url=self.url_for("v1"), api_key=self.api_key or "EMPTY", max_retries=0, **kwargs
        )

    def get_async_client(self, **kwargs):
        import openai

        return openai.AsyncOpenAI(
            base_url=self.url_for("v1"), api_key=self.api_key or "EMPTY", max_retries=0, **kwargs
        )

    def metrics(self) -> dict[str, float]:
        """Unlabelled view of /metrics: sample name -> value (summed over labels)."""
        text = httpx.get(self.url_for("metrics"), headers=self.headers(), timeout=5).text
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(value)
        return values

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM; wait; SIGKILL what is left. Returns the exit code."""
        children = self.children()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for p in still_running(children, timeout=10):
            p.kill()
        if self._log is not None:
            self._log.close()
        return self.proc.returncode


def still_running(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to `timeout` s for the processes to exit; those still running.
    A zombie counts as exited: once its parent is gone it waits for PID 1 to
    reap it, which may take a while in a container (psutil.wait_procs waits
    for the reaping, up to a second more per zombie)."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive:
        alive = [p for p in alive if _running(p)]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    return alive


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_exited(procs: list[psutil.Process], timeout: float = 10.0) -> None:
    """Wait until every process has exited (a zombie awaiting its parent's
    reaping counts as exited); fail if one is still running."""
    alive = still_running(procs, timeout)
    assert not alive, f"processes {[p.pid for p in alive]} still running"


@pytest.fixture(scope="session")
def chat_template_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("template") / "chat.jinja"
    path.write_text(CHAT_TEMPLATE)
    return str(path)


def default_server_args(chat_template_file: str) -> list[str]:
    # 64 MiB of KV: ~130k tokens of the tiny model, room for 50+ long requests.
    return [
        "--dtype",
        "float32",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--kv-cache-memory-bytes",
        str(64 * 2**20),
        "--chat-template",
        chat_template_file,
        "--max-num-seqs",
        "64",
        "--max-logprobs",
        "5",
    ]
