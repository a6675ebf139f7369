"""`vllm chat`, `vllm complete` and `vllm run-batch` against ONE real
`vllm serve` subprocess on a tiny random llama (upstream:
tests/entrypoints/openai/test_run_batch.py and the CLI tests).

The model's generation_config.json makes the server greedy with a few tokens
by default (the chat / complete commands send no sampling parameters), so an
answer printed by the CLI can be checked against the server's own answer to
the same conversation. chat and complete run in a pseudo-terminal (pexpect):
the "> " prompt, streamed answers, the chat history, end of input (Ctrl-D).
run-batch runs its own in-process engine on the same model: its good lines
must equal the server's greedy answers, its bad lines fail in place.

Time: the two run-batch processes (generation, embeddings) start with the
server, so their engines start on the second core while the server starts;
the one-shot commands (-q, errors) run in this process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from tests.entrypoints.openai.conftest import (
    CHAT_TEMPLATE,
    REPO_ROOT,
    SERVER_START_TIMEOUT_S,
    RemoteOpenAIServer,
    get_open_port,
)
from tests.utils import make_tiny_model

API_KEY = "cli-key"
MAX_TOKENS = 6  # the generation config's max_new_tokens: the CLI's answers
CLI = [sys.executable, "-m", "vllm.entrypoints.cli.main"]
ENGINE = [
    "--dtype",
    "float32",
    "--max-model-len",
    "256",
    "--kv-cache-memory-bytes",
    str(16 * 2**20),
]
TIMEOUT = 60


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    path = make_tiny_model("llama", str(tmp_path_factory.mktemp("cli-llama")))
    gen_path = os.path.join(path, "generation_config.json")
    with open(gen_path) as f:
        gen = json.load(f)
    gen.update(temperature=0.0, max_new_tokens=MAX_TOKENS)
    with open(gen_path, "w") as f:
        json.dump(gen, f)
    return path


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("cli-template") / "chat.jinja"
    path.write_text(CHAT_TEMPLATE)
    return str(path)


@dataclasses.dataclass
class BatchRun:
    """One `vllm run-batch` subprocess and its files."""

    proc: subprocess.Popen
    output: Path
    log: Path
    model: str

    def result(self) -> list[dict]:
        assert self.proc.wait(timeout=300) == 0, self.log.read_text()[-4000:]
        return [json.loads(line) for line in self.output.read_text().splitlines()]


def _start_batch(tmp: Path, lines: list[str], model: str, args: list[str]) -> BatchRun:
    src, dst, log = tmp / "in.jsonl", tmp / "out.jsonl", tmp / "log.txt"
    src.write_text("\n".join(lines) + "\n")
    with open(log, "wb") as f:
        proc = subprocess.Popen(
            [*CLI, "run-batch", "-i", str(src), "-o", str(dst), "--model", model, *args],
            cwd=REPO_ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )
    return BatchRun(proc, dst, log, model)


@pytest.fixture(scope="module")
def batch_runs(model, template, tmp_path_factory):
    """Both run-batch processes, started before the server (see the top)."""
    from tests.models.test_encoder_pooling import _st_dir

    gen_args = [*ENGINE, "--chat-template", template]
    tmp = tmp_path_factory.mktemp
    runs = {"gen": _start_batch(tmp("batch"), _batch_lines(model), model, gen_args)}
    st_dir = _st_dir("bert", tmp("st"))
    embed_args = ["--runner", "pooling", "--dtype", "float32", "--max-model-len", "128"]
    runs["embed"] = _start_batch(tmp("batch"), EMBED_LINES, st_dir, embed_args)
    try:
        yield runs
    finally:
        for run in runs.values():
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait(10)


@pytest.fixture(scope="module")
def server(model, template, batch_runs):
    args = [*ENGINE, "--chat-template", template, "--api-key", API_KEY]
    srv = RemoteOpenAIServer(model, args, api_key=API_KEY, wait=False)
    try:
        # It starts alongside both run-batch engines: more than the usual time.
        srv.wait_until_healthy(timeout=2 * SERVER_START_TIMEOUT_S)
        yield srv
    finally:
        srv.stop()


def _run_in_process(argv: list[str]) -> tuple[int, str, str]:
    """`vllm ARGV` in this process: (exit status, stdout, stderr). The chat
    commands install SIGINT / SIGTSTP handlers: pytest's are put back."""
    from vllm.entrypoints.cli.main import main

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTSTP)}
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(argv)
    except SystemExit as e:
        code = e.code
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    return (
        (code if isinstance(code, int) else 1),
        out.getvalue(),
        err.getvalue() + (code if isinstance(code, str) else ""),
    )


def _spawn(args: list[str], env: dict[str, str] | None = None) -> pexpect.spawn:
    child = pexpect.spawn(
        CLI[0],
        [*CLI[1:], *args],
        cwd=str(REPO_ROOT),
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        encoding="utf-8",
        codec_errors="replace",
        timeout=TIMEOUT,
        dimensions=(24, 1000),
    )
    return child


def _tty(text: str) -> str:
    """`text` as the terminal shows it (newlines become CRLF)."""
    return text.replace("\n", "\r\n")


def _wait_exit(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus is not None, child.signalstatus
    return child.exitstatus


def test_chat_interactive_keeps_history(server, model):
    """Two turns with a system prompt, key from OPENAI_API_KEY; each answer
    equals the server's greedy answer to the whole conversation so far."""
    client = server.get_client()
    system = "You are terse."
    child = _spawn(
        ["chat", "--url", server.url_for("v1"), "--system-prompt", system],
        env={"OPENAI_API_KEY": API_KEY},
    )
    child.expect_exact(f"Using model: {model}")
    child.expect_exact("Please enter a message for the chat model:")
    conversation = [{"role": "system", "content": system}]
    for message in ("hello there", "and the fox?"):
        child.expect_exact("> ")
        child.sendline(message)
        conversation.append({"role": "user", "content": message})
        answer = client.chat.completions.create(model=model, messages=conversation)
        text = answer.choices[0].message.content
        assert text and answer.usage.completion_tokens <= MAX_TOKENS
        # The echoed message, then the streamed answer.
        child.expect_exact(_tty(f"{message}\n{text}\n"))
        conversation.append({"role": "assistant", "content": text})
    child.expect_exact("> ")
    child.sendeof()  # Ctrl-D: a clean exit
    assert _wait_exit(child) == 0


def test_chat_quick_with_model_name_and_stats(server, model):
    argv = ["chat", "--url", server.url_for("v1"), "--api-key", API_KEY, "--model-name", model]
    code, out, _ = _run_in_process([*argv, "-q", "quick question", "--stats"])
    answer = server.get_client().chat.completions.create(
        model=model, messages=[{"role": "user", "content": "quick question"}]
    )
    assert code == 0
    text = answer.choices[0].message.content
    assert out.startswith(f"Using model: {model}\n{text}\nTTFT: "), out
    tps = re.search(r"\nTPS:  [0-9.]+ tokens/s \((\d+) tokens in [0-9.]+s\)\n$", out)
    assert tps is not None and int(tps.group(1)) == answer.usage.completion_tokens, out


def test_complete_interactive_and_refused_prompt(server, model):
    """Prompts one per line with --max-tokens; a prompt the server refuses
    (longer than the model) prints its error and the session goes on; Ctrl-C
    ends it."""
    client = server.get_client()
    child = _spawn(
        ["complete", "--url", server.url_for("v1"), "--api-key", API_KEY, "--max-tokens", "4"]
    )
    child.expect_exact("Please enter prompt to complete:")
    for prompt in ("The quick brown", "x " * 400, "def hello"):
        child.expect_exact("> ")
        child.sendline(prompt)
        if len(prompt) > 100:
            child.expect_exact("Error: Error code: 400")
            child.expect_exact("maximum context length")
            continue
        ref = client.completions.create(model=model, prompt=prompt, max_tokens=4)
        assert ref.usage.completion_tokens == 4
        child.expect_exact(_tty(f"{ref.choices[0].text}\n"))
    child.expect_exact("> ")
    child.sendintr()  # Ctrl-C ends the session quietly, as upstream
    assert _wait_exit(child) == 0


def test_unreachable_server_is_one_line_error():
    port = get_open_port()  # nothing listens there
    code, out, err = _run_in_process(
        ["complete", "--url", f"http://127.0.0.1:{port}/v1", "-q", "hi"]
    )
    assert (code, out, err) == (1, "", "Error: Connection error.\n")


# ----------------------------------------------------------------------
# run-batch
# ----------------------------------------------------------------------

CHAT_BODY = {"messages": [{"role": "user", "content": "the lazy dog"}], "max_tokens": 8}
CHAT_BODY_2 = {
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "keys"}],
    "max_completion_tokens": 5,
    "temperature": 0,
}
COMPLETION_BODY = {"prompt": "Paged attention stores", "max_tokens": 7, "temperature": 0}
EMBED_TEXTS = ["the quick brown fox", "paris", "keys and values ."]


def _line(custom_id: str, url: str, body: dict, method: str = "POST") -> str:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body})


# For a pooling model: two good embeddings lines around two it refuses.
EMBED_LINES = [
    _line("one", "/v1/embeddings", {"input": EMBED_TEXTS[0]}),
    _line("chat", "/v1/chat/completions", CHAT_BODY),
    _line("many", "/v1/embeddings", {"input": EMBED_TEXTS[1:], "encoding_format": "base64"}),
    _line("bytes", "/v1/embeddings", {"input": "paris", "encoding_format": "bytes"}),
]


def _batch_lines(model: str) -> list[str]:
    return [
        _line("chat-1", "/v1/chat/completions", {"model": model, **CHAT_BODY}),
        '{"custom_id": "broken", "method": "POST"',  # invalid JSON
        _line("cmpl-1", "/v1/completions", COMPLETION_BODY),
        "",  # blank lines are skipped
        _line("unknown-url", "/v1/nothing", COMPLETION_BODY),
        _line("bad-body", "/v1/chat/completions", {"max_tokens": 4}),  # no messages
        _line("too-long", "/v1/completions", {"prompt": "hi", "max_tokens": 100000}),
        _line("streamed", "/v1/completions", {**COMPLETION_BODY, "stream": True}),
        _line("get", "/v1/completions", COMPLETION_BODY, method="GET"),
        _line("embed", "/v1/embeddings", {"input": "hi"}),
        json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),  # no custom_id
        _line("wrong-model", "/v1/completions", {**COMPLETION_BODY, "model": "nope"}),
        _line("chat-2", "/v1/chat/completions", CHAT_BODY_2),
    ]


def test_run_batch_good_and_bad_lines_in_order(server, model, batch_runs):
    out = batch_runs["gen"].result()
    assert [o["custom_id"] for o in out] == [
        "chat-1",
        None,
        "cmpl-1",
        "unknown-url",
        "bad-body",
        "too-long",
        "streamed",
        "get",
        "embed",
        None,
        "wrong-model",
        "chat-2",
    ]
    by_id = {o["custom_id"]: o for o in out if o["custom_id"]}
    client = server.get_client()
    chat = client.chat.completions.create(model=model, **CHAT_BODY)
    chat_2 = client.chat.completions.create(model=model, **CHAT_BODY_2)
    cmpl = client.completions.create(model=model, **COMPLETION_BODY)
    for cid, ref in (("chat-1", chat), ("chat-2", chat_2), ("cmpl-1", cmpl)):
        got = by_id[cid]
        assert got["error"] is None and got["response"]["status_code"] == 200
        body = got["response"]["body"]
        usage = body["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
            ref.usage.prompt_tokens,
            ref.usage.completion_tokens,
        )
        if cid.startswith("chat"):
            assert body["choices"][0]["message"]["content"] == ref.choices[0].message.content
        else:
            assert body["choices"][0]["text"] == ref.choices[0].text
    assert by_id["chat-2"]["response"]["body"]["usage"]["completion_tokens"] == 5
    errors = {o["custom_id"] or f"line-{i}": o for i, o in enumerate(out)}
    for o in errors.values():
        if o["error"] is not None:
            assert o["response"]["body"] is None
            assert o["response"]["status_code"] >= 400
    assert "invalid JSON" in errors["line-1"]["error"]
    assert "custom_id" in errors["line-9"]["error"]
    assert "Supported endpoints" in errors["unknown-url"]["error"]
    assert errors["bad-body"]["error"]["error"]["code"] == 400
    assert "messages" in errors["bad-body"]["error"]["error"]["message"]
    too_long = errors["too-long"]["error"]["error"]
    assert too_long["code"] == 400 and "max_tokens" in too_long["message"]
    assert errors["streamed"]["error"] == "Request must not be sent in stream mode"
    assert "only POST" in errors["get"]["error"]
    assert "does not support endpoint: /v1/embeddings" in errors["embed"]["error"]
    assert errors["wrong-model"]["response"]["status_code"] == 404
    assert errors["wrong-model"]["error"]["error"]["type"] == "NotFoundError"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-i", "http://example.com/in.jsonl", "-o", "out.jsonl"], "URLs are not supported"),
        (["-i", "/nonexistent/in.jsonl", "-o", "out.jsonl"], "no such file"),
        (["-o", "out.jsonl"], "the following arguments are required: -i/--input-file"),
        (["-i", "IN", "-o", "/nonexistent/dir/out.jsonl"], "no such directory"),
        (["-i", "IN", "-o", "o", "--output-tmp-dir", "/tmp"], "unrecognized arguments"),
    ],
)
def test_run_batch_refuses_bad_flags_before_the_engine(tmp_path, capsys, args, message):
    from vllm.entrypoints.cli.main import main

    src = tmp_path / "in.jsonl"
    src.write_text("")
    args = [str(src) if a == "IN" else a for a in args]
    with pytest.raises(SystemExit) as exc:
        main(["run-batch", *args, "--model", "unused"])
    text = str(exc.value.code) + capsys.readouterr().err
    assert message in text


def test_run_batch_embeddings_match_sentence_transformers(batch_runs):
    """/v1/embeddings lines on a pooling model (a tiny BERT sentence-
    transformers directory) equal SentenceTransformer.encode; a chat line
    and a binary encoding_format there fail in place."""
    import base64

    import numpy as np
    from sentence_transformers import SentenceTransformer

    run = batch_runs["embed"]
    out = run.result()
    assert [o["custom_id"] for o in out] == ["one", "chat", "many", "bytes"]
    one, chat, many, raw = out
    rows = [one["response"]["body"]["data"][0]["embedding"]]
    rows += [
        np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.float32).tolist()
        for d in many["response"]["body"]["data"]
    ]
    ref = SentenceTransformer(run.model, device="cpu").encode(EMBED_TEXTS)
    np.testing.assert_allclose(np.array(rows, dtype=np.float32), ref, atol=1e-5, rtol=0)
    assert "does not support endpoint: /v1/chat/completions" in chat["error"]
    assert "cannot be written to a JSONL file" in raw["error"]
