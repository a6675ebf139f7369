"""Every file under examples/ runs, as users run it, so none rots (issue 23 item 3).

The examples are discovered by globbing the tree: a new example without a
case below fails `test_every_example_has_a_case`. Offline examples run in a
subprocess each, on a tiny random Llama (the embedding one on a tiny BERT
sentence-transformers directory, multi-LoRA with a random peft adapter;
`basic.py` on the embedded SmolLM2 model it defaults to); online ones against
ONE module-scoped `vllm serve` (tiny Llama with the hermes tool parser and
the qwen3 reasoning parser, plus the tiny BERT through `--embedding-model`).
Each case checks what the example prints, not only its exit code.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.entrypoints.openai.conftest import CHAT_TEMPLATE, RemoteOpenAIServer

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300  # liveness bound on a loaded 2-core machine, not a timing assertion
# Engine flags for the tiny model: no torch.compile, a small KV cache.
TINY_ENGINE = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager"]


@dataclass
class Models:
    llama: str
    emb: str
    lora: str
    template: str


@dataclass
class Case:
    example: str  # path under examples/
    args: Callable[[Models], list[str]]
    check: Callable[[str], None]
    id: str = ""
    env: dict[str, str] = field(default_factory=dict)


def _lines(out: str, prefix: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(prefix)]


def _check_basic(out: str) -> None:
    outputs = _lines(out, "Output:")
    assert len(_lines(out, "Prompt:")) == len(outputs) == 4
    capital = _lines(out, "Prompt:").index("Prompt:    'The capital of France is'")
    assert "Paris" in outputs[capital]


def _check_structured(out: str) -> None:
    values = {m[0]: m[1] for m in re.findall(r"^(\w+): '(.*)' \(finish_reason", out, re.M)}
    assert values["choice"] in ("positive", "negative")
    assert re.fullmatch(r"[a-z]{2,8}@[a-z]{2,8}\.com", values["regex"])
    assert re.fullmatch(
        r"SELECT (name|email|age) FROM users WHERE age > [1-9][0-9]?", values["grammar"]
    )
    assert re.search(r"^parsed: \{'name': '(Ada|Alan|Grace)', 'age': \d+\}$", out, re.M), out


def _check_beams(out: str) -> None:
    beams = _lines(out, "  beam ")
    assert len(beams) == 2 * 3
    scores = [float(re.search(r"logprob=(-?[\d.]+)", b)[1]) for b in beams[:3]]
    assert scores == sorted(scores, reverse=True)  # same length: ranked by logprob


def _check_prefix(out: str) -> None:
    cached = [int(n) for n in re.findall(r"^second batch: .*cached: (\d+)\)$", out, re.M)]
    assert len(cached) == 2 and all(n >= 16 for n in cached), out  # >= one block reused


def _check_tp(backend: str) -> Callable[[str], None]:
    def check(out: str) -> None:
        assert f"executor: {backend}, tensor_parallel_size: 2" in out
        assert len(_lines(out, "Prompt:")) == 2

    return check


def _check_tools(out: str) -> None:
    assert re.search(
        r'^tool call: get_current_weather\(\{"city": "(Paris|Tokyo|Lima)"\}\)$', out, re.M
    )
    assert _lines(out, "tool result: It is 21 degrees") and _lines(out, "answer:")


def _check_embed(out: str) -> None:
    dims = re.findall(r"dim=(\d+)", out)
    assert len(dims) == 4 and len(set(dims)) == 1
    cosines = [float(c) for c in re.findall(r"= (-?[\d.]+)$", out, re.M)]
    assert len(cosines) == 3 and all(-1.0001 <= c <= 1.0001 for c in cosines)


def _check_lora(out: str) -> None:
    base, adapter = _lines(out, "base model:"), _lines(out, "adapter0:")
    assert base and adapter
    assert base[0].split(":", 1)[1] != adapter[0].split(":", 1)[1]  # the adapter changes it


def _count(prefix: str, n: int) -> Callable[[str], None]:
    def check(out: str) -> None:
        assert len(_lines(out, prefix)) == n, out

    return check


def _has(*needles: str) -> Callable[[str], None]:
    def check(out: str) -> None:
        for needle in needles:
            assert needle in out, out

    return check


def _check_curl(out: str) -> None:
    for kind in ("list", "text_completion", "chat.completion"):
        assert re.search(rf'"object":\s*"{re.escape(kind)}"', out), out
    assert out.rstrip().endswith("data: [DONE]")


def _tiny(*extra: str) -> Callable[[Models], list[str]]:
    return lambda m: ["--model", m.llama, *TINY_ENGINE, "--max-tokens", "8", *extra]


OFF = "examples/offline_inference/"
ON = "examples/online_serving/"
OFFLINE = [
    Case(OFF + "basic.py", lambda m: ["--enforce-eager"], _check_basic),
    Case(OFF + "chat.py", _tiny("--chat-template", "{t}"), _count("Batch answer:", 2)),
    Case(OFF + "structured_outputs.py", _tiny("--max-tokens", "64"), _check_structured),
    Case(OFF + "beam_search.py", _tiny(), _check_beams),
    Case(OFF + "prefix_caching.py", _tiny(), _check_prefix),
    Case(OFF + "tensor_parallel.py", _tiny(), _check_tp("mp"), "mp"),
    Case(
        OFF + "tensor_parallel.py",
        _tiny("--distributed-executor-backend", "ray"),
        _check_tp("ray"),
        "ray",
    ),
    Case(
        OFF + "chat_with_tools.py",
        _tiny("--chat-template", "{t}", "--max-tokens", "128"),
        _check_tools,
    ),
    Case(OFF + "embed.py", lambda m: ["--model", m.emb, "--dtype", "float32"], _check_embed),
    Case(OFF + "multilora_inference.py", _tiny("--lora-path", "{lora}"), _check_lora),
    Case(OFF + "spec_decode.py", _tiny(), _count("Prompt:", 2)),
]
ONLINE = [
    Case(ON + "openai_completion_client.py", lambda m: [], _has("choice 1:", "usage:")),
    Case(
        ON + "openai_completion_client.py",
        lambda m: ["--stream"],
        _has("streamed choice 0:", "streamed choice 1:", "usage:"),
        "stream",
    ),
    Case(ON + "openai_chat_completion_client.py", lambda m: [], _has("assistant:", "usage:")),
    Case(
        ON + "openai_chat_completion_client.py",
        lambda m: ["--stream"],
        _has("streamed assistant:", "finish_reason: "),
        "stream",
    ),
    Case(ON + "openai_embedding_client.py", lambda m: [], _count("'", 3)),
    Case(
        ON + "openai_chat_completion_client_with_tools.py",
        lambda m: ["--max-tokens", "8"],
        _has("finish_reason:", "streamed tool calls:"),
    ),
    Case(
        ON + "openai_chat_completion_with_reasoning.py",
        lambda m: ["--max-tokens", "8"],
        _has("streamed content:"),
    ),
    Case(
        ON + "openai_curl_client.sh",
        lambda m: [],
        _check_curl,
    ),
]


def _id(case: Case) -> str:
    name = Path(case.example).stem
    return f"{name}-{case.id}" if case.id else name


def _run(case: Case, models: Models, extra: list[str], env: dict[str, str]) -> str:
    path = ROOT / case.example
    subst = {"{t}": models.template, "{lora}": models.lora}
    args = [subst.get(a, a) for a in case.args(models)] + extra
    launcher = ["bash"] if path.suffix == ".sh" else [sys.executable]
    # The venv first on PATH: the curl example reads JSON with `python3`.
    path_env = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    proc = subprocess.run(
        [*launcher, str(path), *args],
        cwd=ROOT,
        env={**os.environ, "PATH": path_env, **env, **case.env},
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout


def test_every_example_has_a_case_and_a_docstring():
    found = {
        p.relative_to(ROOT).as_posix()
        for p in (ROOT / "examples").rglob("*")
        if p.suffix in (".py", ".sh")
    }
    assert found == {c.example for c in OFFLINE + ONLINE}
    for rel in found:
        text = (ROOT / rel).read_text()
        if rel.endswith(".py"):
            doc = ast.get_docstring(ast.parse(text))
            first = doc.splitlines()[0] if doc else ""
        else:  # a shell script: its first comment line after the shebang
            first = text.splitlines()[1].lstrip("# ")
        assert len(first) > 20, f"{rel}: no one-line summary of what it shows"


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory) -> Models:
    from tests.lora.peft_utils import make_peft_adapter
    from tests.models.test_encoder_pooling import _st_dir

    root = tmp_path_factory.mktemp("examples")
    llama = tiny_model_dir("llama")
    lora = str(root / "lora")
    make_peft_adapter(llama, lora, r=8, lora_alpha=16)
    template = root / "chat.jinja"
    template.write_text(CHAT_TEMPLATE)
    return Models(llama=llama, emb=_st_dir("bert", root), lora=lora, template=str(template))


@pytest.fixture(scope="module")
def offline_runs(models, request):
    """The selected offline examples, started together two at a time (most of
    each run is one interpreter importing torch and vllm, on one core), each
    with one OpenMP thread and the engine core in process. A test waits for
    its own example's output."""
    selected = [
        item.callspec.id
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_offline_example"
    ]
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
    }
    pool = ThreadPoolExecutor(max_workers=2)
    runs = {_id(c): pool.submit(_run, c, models, [], env) for c in OFFLINE if _id(c) in selected}
    yield runs
    pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("case", OFFLINE, ids=_id)
def test_offline_example(case, offline_runs):
    case.check(offline_runs[_id(case)].result())


@pytest.fixture(scope="module")
def server(models):
    args = [
        *TINY_ENGINE,
        "--kv-cache-memory-bytes",
        str(16 * 2**20),
        "--chat-template",
        models.template,
        "--served-model-name",
        "tiny",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
        "--embedding-model",
        models.emb,
        "--embedding-served-model-name",
        "tiny-emb",
        "--embedding-dtype",
        "float32",
        "--embedding-max-model-len",
        "64",
    ]
    srv = RemoteOpenAIServer(models.llama, args)
    yield srv
    srv.stop()


@pytest.mark.parametrize("case", ONLINE, ids=_id)
def test_online_example(case, server, models):
    if case.example.endswith(".sh"):
        out = _run(case, models, [], {"BASE_URL": server.url_root, "MAX_TOKENS": "4"})
    else:
        extra = ["--base-url", server.url_for("v1")]
        if "--max-tokens" not in case.args(models) and "embedding" not in case.example:
            extra += ["--max-tokens", "6"]
        out = _run(case, models, extra, {})
    case.check(out)
