"""The playground and engine dashboard at `/` (vllm/entrypoints/serve/playground/)
in a real headless Chromium (Debian's `chromium` and `chromium-driver`, driven
by Selenium; the Makefile's `browser` target installs them) against ONE real
`vllm serve` of the embedded SmolLM2 model with --api-key: without the key the
page loads but can do nothing; with it a chat answer streams in token by token
(the model's greedy answer, with its logprobs), the completions panel completes,
the dashboard's counters move while a load runs; and every request the browser
made went to the server's own origin.

Set PLAYGROUND_SCREENSHOT=docs/images/playground.png to refresh the README's
screenshot (taken under load); otherwise it goes to a temporary file.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.entrypoints.openai.conftest import RemoteOpenAIServer
from vllm.entrypoints.openai.api_server import build_app
from vllm.entrypoints.openai.cli_args import make_arg_parser
from vllm.entrypoints.serve.playground.api_router import ASSETS, CONTENT_SECURITY_POLICY

KEY = "sk-playground"
MODEL = "smollm2"
CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
# Generous: a loaded 2-core machine decodes the embedded model slowly.
WAIT_S = 180


# ---- the routes, in process (no engine needed) ---------------------------------------
def _client(*flags: str) -> TestClient:
    return TestClient(build_app(make_arg_parser(argparse.ArgumentParser()).parse_args(list(flags))))


def test_routes_serve_the_packaged_files_and_the_flag_removes_them():
    client = _client()
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    for name, media_type in ASSETS.items():
        assert f'"playground/{name}"' in page.text, name
        asset = client.get(f"/playground/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"] == media_type
    assert client.get("/playground/nothing.js").status_code == 404
    assert "/" not in client.get("/openapi.json").json()["paths"]
    off = _client("--disable-playground")
    for path in ("/", *(f"/playground/{name}" for name in ASSETS)):
        assert off.get(path).status_code == 404, path


def test_with_api_key_only_the_static_files_are_open():
    client = _client("--api-key", KEY)
    assert client.get("/").status_code == 200
    assert client.get("/playground/app.js").status_code == 200
    for path in ("/v1/models", "/metrics", "/playground/nothing.js", "/playground/"):
        assert client.get(path).status_code == 401, path
    with_key = {"Authorization": f"Bearer {KEY}"}
    assert client.get("/playground/nothing.js", headers=with_key).status_code == 404


# ---- the page in a browser, against a real server ----------------------------------
@pytest.fixture(scope="module")
def server(embedded_model_path) -> Iterator[RemoteOpenAIServer]:
    args = ["--served-model-name", MODEL, "--max-model-len", "1024"]
    args += ["--kv-cache-memory-bytes", str(64 * 2**20), "--api-key", KEY]
    srv = RemoteOpenAIServer(embedded_model_path, args, api_key=KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.fail(
            "chromium and chromedriver are needed: `make browser` (as root: apt-get install "
            "-y chromium chromium-driver)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--window-size=1440,960",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
    ):
        options.add_argument(flag)
    # The DevTools network log: every request the page makes.
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.network_log = []
    yield driver
    driver.quit()


def until(predicate: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def network(driver) -> list[dict[str, Any]]:
    """The DevTools Network.* events so far (the log is drained on read)."""
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"].startswith("Network."):
            driver.network_log.append(message)
    return driver.network_log


def statuses(driver, suffix: str) -> list[int]:
    return [
        m["params"]["response"]["status"]
        for m in network(driver)
        if m["method"] == "Network.responseReceived"
        and m["params"]["response"]["url"].endswith(suffix)
    ]


def js(driver, script: str, *args: Any) -> Any:
    return driver.execute_script(script, *args)


def value(driver, element_id: str) -> float | None:
    raw = js(driver, "return document.getElementById(arguments[0]).dataset.value", element_id)
    return float(raw) if raw not in (None, "") else None


def set_field(driver, element_id: str, text: str) -> None:
    js(driver, "document.getElementById(arguments[0]).value = arguments[1]", element_id, text)


def data_state(driver, element_id: str) -> str | None:
    return driver.find_element("id", element_id).get_attribute("data-state")


def post(server: RemoteOpenAIServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url_for(path), json=body, headers=server.headers(), timeout=300)


def test_page_is_closed_without_the_key(server, browser):
    browser.get(server.url_root + "/")
    until(lambda: "401" in browser.find_element("id", "conn-status").text, "the 401 of /v1/models")
    until(lambda: "401" in browser.find_element("id", "dash-status").text, "the 401 of /metrics")
    assert js(browser, "return document.getElementById('model').options.length") == 0
    set_field(browser, "chat-input", "Hello?")
    browser.find_element("id", "chat-send").click()
    done = "return document.querySelector('.msg.assistant[data-done=\"1\"]')"
    answer = until(lambda: js(browser, done), "the refused chat")
    assert "failed" in answer.get_attribute("class") and "401" in answer.text
    assert statuses(browser, "/") == [200]
    for path in ("/v1/models", "/metrics", "/v1/chat/completions"):
        codes = statuses(browser, path)
        assert codes and set(codes) == {401}, (path, codes)


def test_chat_streams_the_models_answer_with_logprobs(server, browser):
    set_field(browser, "api-key", KEY)
    browser.find_element("id", "connect").click()
    until(lambda: data_state(browser, "conn-status") == "ok", "connect")
    assert js(browser, "return document.getElementById('model').value") == MODEL
    browser.find_element("id", "chat-clear").click()
    for field, text in (("p-temperature", "0"), ("p-max-tokens", "16"), ("p-top-logprobs", "3")):
        set_field(browser, field, text)
    browser.find_element("id", "p-logprobs").click()
    # Every state of the answer's text as the page renders it.
    js(
        browser,
        """window.seen = [];
        new MutationObserver(() => {
          const a = document.querySelector('.msg.assistant .body');
          if (a) window.seen.push(a.textContent);
        }).observe(document.getElementById('chat-log'),
                   {childList: true, subtree: true, characterData: true});""",
    )
    question = "What is the capital of France?"
    set_field(browser, "chat-input", question)
    browser.find_element("id", "chat-send").click()
    done = "return document.querySelector('.msg.assistant[data-done=\"1\"]')"
    answer = until(lambda: js(browser, done), "the streamed answer")
    text = js(browser, "return arguments[0].querySelector('.body').textContent", answer)
    seen = [s for s in js(browser, "return window.seen") if s]
    assert len(set(seen)) >= 3 and all(text.startswith(s) for s in seen), seen  # grew in steps
    assert int(answer.get_attribute("data-chunks")) >= 3
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}]}
    body |= {"temperature": 0, "max_tokens": 16}
    reply = post(server, "v1/chat/completions", body)
    assert text == reply.json()["choices"][0]["message"]["content"]  # the model's greedy answer
    # One span per token, its probability and top 3 alternatives in its title
    # (the final end-of-sequence token has no text: not shown).
    tokens = answer.find_elements("css selector", ".tok")
    assert len(tokens) >= reply.json()["usage"]["completion_tokens"] - 1 >= 3
    assert "".join(js(browser, "return arguments[0].textContent", t) for t in tokens) == text
    assert all(len(t.get_attribute("title").splitlines()) == 1 + 3 for t in tokens)
    tokens[0].click()
    rows = browser.find_elements("css selector", "#token-detail tr")
    assert len(rows) == 1 + 3  # the chosen token and its top 3


def test_chat_json_schema_mode(server, browser):
    """JSON-schema mode sends the schema as response_format: the answer is
    JSON of that shape (the page says so)."""
    js(
        browser,
        """const mode = document.getElementById('p-mode');
        mode.value = 'json_schema';
        mode.dispatchEvent(new Event('change'));""",
    )
    assert browser.find_element("id", "p-schema").is_displayed()
    browser.find_element("id", "chat-clear").click()
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    set_field(browser, "p-schema", json.dumps(schema))
    set_field(browser, "p-max-tokens", "32")
    set_field(browser, "chat-input", "Name the capital of France.")
    browser.find_element("id", "chat-send").click()
    done = "return document.querySelector('.msg.assistant[data-done=\"1\"]')"
    answer = until(lambda: js(browser, done), "the JSON answer")
    text = js(browser, "return arguments[0].querySelector('.body').textContent", answer)
    parsed = json.loads(text)
    assert isinstance(parsed["city"], str)
    assert answer.find_element("css selector", ".note.ok").text == "valid JSON"
    js(
        browser,
        """const mode = document.getElementById('p-mode');
        mode.value = 'text';
        mode.dispatchEvent(new Event('change'));""",
    )


def test_chat_tool_mode(server, browser):
    """Tool mode sends `tools` and `tool_choice` ("required": constrained, no
    parser needed): the streamed call is shown as name(arguments)."""
    js(
        browser,
        """const mode = document.getElementById('p-mode');
        mode.value = 'tools';
        mode.dispatchEvent(new Event('change'));""",
    )
    browser.find_element("id", "chat-clear").click()
    set_field(browser, "p-max-tokens", "48")
    set_field(browser, "chat-input", "What is the weather in Paris?")
    browser.find_element("id", "chat-send").click()
    done = "return document.querySelector('.msg.assistant[data-done=\"1\"]')"
    answer = until(lambda: js(browser, done), "the tool call")
    assert answer.get_attribute("data-finish") == "tool_calls"
    call = js(browser, "return arguments[0].querySelector('.tool-call').textContent", answer)
    name, _, arguments = call.partition("(")
    assert name == "get_weather" and isinstance(json.loads(arguments[:-1])["city"], str)
    js(
        browser,
        """const mode = document.getElementById('p-mode');
        mode.value = 'text';
        mode.dispatchEvent(new Event('change'));""",
    )


def test_completions_panel(server, browser):
    browser.find_element("css selector", ".tab[data-panel='panel-completions']").click()
    prompt = "The capital of France is"
    set_field(browser, "comp-prompt", prompt)
    set_field(browser, "p-max-tokens", "8")
    browser.find_element("id", "p-logprobs").click()  # off again: plain text
    browser.find_element("id", "comp-run").click()
    output = browser.find_element("id", "comp-output")
    until(lambda: output.get_attribute("data-done"), "the completion")
    shown = js(browser, "return document.getElementById('comp-output').textContent")
    body = {"model": MODEL, "prompt": prompt, "temperature": 0, "max_tokens": 8}
    reply = post(server, "v1/completions", body)
    assert shown == prompt + reply.json()["choices"][0]["text"]
    browser.find_element("css selector", ".tab[data-panel='panel-chat']").click()


def test_dashboard_moves_under_load(server, browser, tmp_path):
    until(lambda: data_state(browser, "dash-status") == "ok", "metrics")
    until(lambda: value(browser, "m-gen-total") is not None, "a sample")
    gen_before, done_before = value(browser, "m-gen-total"), value(browser, "m-done")
    assert gen_before is not None and done_before is not None
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 48, "ignore_eos": True}

    def request(_: int) -> int:
        return post(server, "v1/completions", body).status_code

    with ThreadPoolExecutor(4) as pool:
        load = pool.map(request, range(4))
        # Earlier tests ran one request at a time: 2+ running is this load, batched.
        until(lambda: (value(browser, "m-running") or 0) >= 2, "the load's requests running")
        until(lambda: (value(browser, "m-gen-total") or 0) > gen_before, "new generated tokens")
        until(lambda: (value(browser, "m-gen-tps") or 0) > 0, "generation tokens/s")
        # A chat in the page too, for the screenshot: its tokens coloured by probability.
        browser.find_element("id", "chat-clear").click()
        browser.find_element("id", "p-logprobs").click()
        set_field(browser, "p-temperature", "0.8")
        set_field(browser, "p-max-tokens", "24")
        set_field(browser, "chat-input", "Write a haiku about a busy server.")
        browser.find_element("id", "chat-send").click()
        tokens = "return document.querySelectorAll('.msg.assistant .tok').length"
        until(lambda: js(browser, tokens) >= 4, "the chat answer under way")
        shot = os.environ.get("PLAYGROUND_SCREENSHOT") or str(tmp_path / "playground.png")
        assert browser.save_screenshot(shot)
        assert list(load) == [200] * 4
    until(lambda: (value(browser, "m-done") or 0) >= done_before + 4, "the finished requests")
    until(lambda: value(browser, "m-running") == 0, "the engine idle again")
    assert (value(browser, "m-gen-total") or 0) >= gen_before + 4 * 48
    assert (value(browser, "ttft-p50") or 0) > 0 and (value(browser, "tpot-p50") or 0) > 0
    assert value(browser, "m-kv") is not None and value(browser, "m-hit") is not None
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_every_request_went_to_the_server(server, browser):
    """Over the whole session (page load, chat, completions, a minute of
    dashboard polling): no request left the server's origin."""
    sent = [m for m in network(browser) if m["method"] == "Network.requestWillBeSent"]
    urls = [m["params"]["request"]["url"] for m in sent]
    origin = server.url_root + "/"
    elsewhere = [u for u in urls if not u.startswith(origin)]
    assert urls and not elsewhere, elsewhere
    paths = {u[len(origin) - 1 :] for u in urls}
    expected = {"/", "/v1/models", "/metrics", "/v1/chat/completions", "/v1/completions"}
    assert expected | {f"/playground/{name}" for name in ASSETS} <= paths, paths
