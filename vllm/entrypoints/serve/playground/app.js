// The playground's chat and completions panels. Talks only to this server's
// public API (relative URLs, so it also works under --root-path); the API key
// the user types is sent as `Authorization: Bearer` and kept in memory (in
// localStorage only when "remember" is ticked). dashboard.js reads the same
// key through window.vllmPlayground.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const KEY_STORE = "vllm-playground-api-key";
  const state = { key: "", history: [], controller: null };

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function authHeaders(extra) {
    const headers = Object.assign({}, extra);
    if (state.key) headers.Authorization = "Bearer " + state.key;
    return headers;
  }

  // The server's error envelope ({"error": {"message": ...}}) or the API-key
  // middleware's {"error": "Unauthorized"}; anything else as text.
  async function errorOf(resp) {
    const text = await resp.text();
    let message = text || resp.statusText;
    try {
      const err = JSON.parse(text).error;
      message = typeof err === "string" ? err : (err && err.message) || message;
    } catch (e) { /* not JSON: keep the text */ }
    const hint = resp.status === 401 ? " (enter the server's API key above)" : "";
    return new ApiError(resp.status, `${resp.status} ${message}${hint}`);
  }

  async function api(path, options) {
    const opts = Object.assign({}, options);
    opts.headers = authHeaders(Object.assign({ "Content-Type": "application/json" }, opts.headers));
    const resp = await fetch(path, opts);
    if (!resp.ok) throw await errorOf(resp);
    return resp;
  }

  // Server-sent events of a streamed completion: yields each JSON chunk;
  // an error event ({"error": ...} mid-stream) is thrown.
  async function* events(resp) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).trimStart()).join("\n");
        if (!data) continue;
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) {
          const err = chunk.error;
          throw new ApiError(err.code || 500, `${err.code || ""} ${err.message || err}`.trim());
        }
        yield chunk;
      }
    }
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message || "";
    box.hidden = !message;
  }

  function setStatus(el, text, stateName) {
    el.textContent = text;
    el.dataset.state = stateName;
  }

  // ---- connection: the key and the model list ------------------------------
  async function connect() {
    state.key = $("api-key").value.trim();
    if ($("remember-key").checked) localStorage.setItem(KEY_STORE, state.key);
    else localStorage.removeItem(KEY_STORE);
    const select = $("model");
    try {
      const models = (await (await api("v1/models")).json()).data;
      const previous = select.value;
      select.replaceChildren(...models.map((m) => new Option(m.id, m.id)));
      if (models.some((m) => m.id === previous)) select.value = previous;
      setStatus($("conn-status"), `connected: ${models.length} model(s)`, "ok");
      showError("");
    } catch (e) {
      select.replaceChildren();
      setStatus($("conn-status"), e.message, "error");
    }
  }

  // ---- sampling parameters ------------------------------------------------------
  function number(id) {
    const raw = $(id).value.trim();
    return raw === "" ? undefined : Number(raw);
  }

  function samplingParams() {
    const params = {
      temperature: number("p-temperature"),
      top_p: number("p-top-p"),
      max_tokens: number("p-max-tokens"),
      seed: number("p-seed"),
    };
    const stop = $("p-stop").value.split(",").map((s) => s.trim()).filter(Boolean);
    if (stop.length) params.stop = stop;
    for (const k of Object.keys(params)) if (params[k] === undefined) delete params[k];
    return params;
  }

  function parseJsonField(id, what) {
    try {
      return JSON.parse($(id).value);
    } catch (e) {
      throw new ApiError(0, `${what} is not valid JSON: ${e.message}`);
    }
  }

  // response_format / tools for the chosen chat mode.
  function chatModeFields() {
    const mode = $("p-mode").value;
    if (mode === "json_schema") {
      const schema = parseJsonField("p-schema", "The JSON schema");
      return { response_format: { type: "json_schema", json_schema: { name: "playground", schema } } };
    }
    if (mode === "tools") {
      return { tools: parseJsonField("p-tools", "The tools"), tool_choice: $("p-tool-choice").value };
    }
    return {};
  }

  // ---- token-by-token logprob view ------------------------------------------------
  // entry: {token, logprob, top_logprobs: [{token, logprob}]} (chat's shape;
  // completions' are converted to it).
  function tokenSpan(entry) {
    const span = document.createElement("span");
    span.className = "tok";
    span.textContent = entry.token;
    const p = Math.exp(entry.logprob); // NaN when the server sent no logprob
    span.dataset.p = p.toFixed(4);
    // Green for a sure token, red for an unlikely one.
    if (!Number.isNaN(p)) span.style.setProperty("--tok-hue", String(Math.round(120 * p)));
    const alts = (entry.top_logprobs || []).map((t) => `${JSON.stringify(t.token)} ${percent(t.logprob, 1)}`);
    span.title = `${JSON.stringify(entry.token)} ${percent(entry.logprob, 1)}` + (alts.length ? "\n" + alts.join("\n") : "");
    span.addEventListener("click", () => showTokenDetail(entry));
    return span;
  }

  function percent(logprob, digits) {
    return typeof logprob === "number" ? `${(100 * Math.exp(logprob)).toFixed(digits)}%` : "?";
  }

  function showTokenDetail(entry) {
    const box = $("token-detail");
    const table = document.createElement("table");
    const rows = [{ token: entry.token, logprob: entry.logprob, chosen: true }, ...(entry.top_logprobs || [])];
    for (const row of rows) {
      const tr = table.insertRow();
      tr.className = row.chosen ? "chosen" : "";
      tr.insertCell().textContent = JSON.stringify(row.token);
      tr.insertCell().textContent = percent(row.logprob, 2);
      tr.insertCell().textContent = typeof row.logprob === "number" ? row.logprob.toFixed(3) : "–";
    }
    box.replaceChildren(table);
  }

  function completionEntries(logprobs) {
    if (!logprobs || !logprobs.tokens) return [];
    return logprobs.tokens.map((token, i) => ({
      token,
      logprob: logprobs.token_logprobs[i],
      top_logprobs: Object.entries((logprobs.top_logprobs || [])[i] || {})
        .map(([t, lp]) => ({ token: t, logprob: lp })),
    }));
  }

  // ---- chat ---------------------------------------------------------------------------
  function bubble(role, text) {
    const div = document.createElement("div");
    div.className = `msg ${role}`;
    const body = document.createElement("div");
    body.className = "body";
    body.textContent = text || "";
    div.append(body);
    $("chat-log").append(div);
    $("chat-log").scrollTop = $("chat-log").scrollHeight;
    return div;
  }

  function chatBody() {
    const messages = [];
    const system = $("system-prompt").value.trim();
    if (system) messages.push({ role: "system", content: system });
    messages.push(...state.history);
    const body = Object.assign({ model: $("model").value, messages, stream: true,
      stream_options: { include_usage: true } }, samplingParams(), chatModeFields());
    if ($("p-logprobs").checked) {
      body.logprobs = true;
      body.top_logprobs = number("p-top-logprobs") || 0;
    }
    return body;
  }

  // One streamed answer into `msg`; returns what the history keeps.
  async function streamChat(body, msg, signal) {
    const out = msg.querySelector(".body");
    const started = performance.now();
    let firstAt = null, content = "", finish = null, usage = null, pending = [];
    const calls = [];
    msg.dataset.chunks = "0";
    const resp = await api("v1/chat/completions", { method: "POST", body: JSON.stringify(body), signal });
    for await (const chunk of events(resp)) {
      if (chunk.usage) usage = chunk.usage;
      const choice = (chunk.choices || [])[0];
      if (!choice) continue;
      const delta = choice.delta || {};
      const lp = choice.logprobs && choice.logprobs.content;
      // Tokens whose text the server held back (a partial character) come
      // with the next text; the final end-of-sequence token has none.
      if (lp) pending.push(...lp);
      if (delta.content) {
        firstAt = firstAt || performance.now();
        content += delta.content;
        if (pending.length) out.append(...pending.map(tokenSpan));
        else out.append(delta.content);
        pending = [];
      }
      if (delta.reasoning) reasoningBox(msg).append(delta.reasoning);
      for (const call of delta.tool_calls || []) {
        const slot = calls[call.index || 0] || (calls[call.index || 0] = { name: "", arguments: "" });
        if (call.id) slot.id = call.id;
        if (call.function && call.function.name) slot.name += call.function.name;
        if (call.function && call.function.arguments) slot.arguments += call.function.arguments;
      }
      if (choice.finish_reason) finish = choice.finish_reason;
      msg.dataset.chunks = String(Number(msg.dataset.chunks) + 1);
      $("chat-log").scrollTop = $("chat-log").scrollHeight;
    }
    renderToolCalls(msg, calls);
    if ($("p-mode").value === "json_schema") checkJson(msg, content);
    footer(msg, finish, usage, started, firstAt);
    const kept = { role: "assistant", content };
    if (calls.length) {
      kept.tool_calls = calls.map((c, i) => ({ id: c.id || `call_${i}`, type: "function",
        function: { name: c.name, arguments: c.arguments } }));
    }
    return kept;
  }

  // The model's reasoning (--reasoning-parser), shown above its answer.
  function reasoningBox(msg) {
    let box = msg.querySelector(".reasoning");
    if (!box) {
      box = document.createElement("div");
      box.className = "reasoning";
      msg.prepend(box);
    }
    return box;
  }

  function renderToolCalls(msg, calls) {
    for (const call of calls) {
      const pre = document.createElement("pre");
      pre.className = "tool-call";
      pre.textContent = `${call.name}(${call.arguments})`;
      msg.append(pre);
    }
  }

  function checkJson(msg, content) {
    const note = document.createElement("div");
    try {
      JSON.parse(content);
      note.textContent = "valid JSON";
      note.className = "note ok";
    } catch (e) {
      note.textContent = `not JSON: ${e.message}`;
      note.className = "note bad";
    }
    msg.append(note);
  }

  function footer(msg, finish, usage, started, firstAt) {
    const end = performance.now();
    const parts = [`finish: ${finish || "?"}`];
    if (firstAt) parts.push(`TTFT ${(firstAt - started).toFixed(0)} ms`);
    if (usage) {
      parts.push(`${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens`);
      if (firstAt && usage.completion_tokens > 1 && end > firstAt) {
        parts.push(`${((usage.completion_tokens - 1) / ((end - firstAt) / 1000)).toFixed(1)} tok/s`);
      }
    }
    const div = document.createElement("div");
    div.className = "meta";
    div.textContent = parts.join(" · ");
    msg.append(div);
    msg.dataset.done = "1";
    msg.dataset.finish = finish || "";
  }

  async function sendChat(text) {
    showError("");
    state.history.push({ role: "user", content: text });
    bubble("user", text);
    const msg = bubble("assistant", "");
    await running("chat", async (signal) => {
      try {
        state.history.push(await streamChat(chatBody(), msg, signal));
      } catch (e) {
        state.history.pop(); // the question without an answer is not kept
        msg.classList.add("failed");
        msg.dataset.done = "1";
        msg.querySelector(".body").textContent = e.name === "AbortError" ? "(stopped)" : e.message;
        if (e.name !== "AbortError") showError(e.message);
      }
    });
  }

  // Runs `work` with a fresh AbortController; the panel's buttons follow.
  async function running(panel, work) {
    const send = $(panel === "chat" ? "chat-send" : "comp-run");
    const stop = $(panel === "chat" ? "chat-stop" : "comp-stop");
    state.controller = new AbortController();
    send.disabled = true;
    stop.disabled = false;
    try {
      await work(state.controller.signal);
    } finally {
      send.disabled = false;
      stop.disabled = true;
      state.controller = null;
    }
  }

  // ---- completions ------------------------------------------------------------------
  async function runCompletion() {
    showError("");
    const prompt = $("comp-prompt").value;
    const out = $("comp-output");
    const promptSpan = document.createElement("span");
    promptSpan.className = "prompt";
    promptSpan.textContent = prompt;
    out.replaceChildren(promptSpan);
    delete out.dataset.done;
    out.dataset.chunks = "0";
    const body = Object.assign({ model: $("model").value, prompt, stream: true }, samplingParams());
    if ($("p-logprobs").checked) body.logprobs = number("p-top-logprobs") || 0;
    await running("completions", async (signal) => {
      try {
        const resp = await api("v1/completions", { method: "POST", body: JSON.stringify(body), signal });
        for await (const chunk of events(resp)) {
          const choice = (chunk.choices || [])[0];
          if (!choice) continue;
          const entries = completionEntries(choice.logprobs);
          if (entries.length) out.append(...entries.map(tokenSpan));
          else if (choice.text) out.append(choice.text);
          if (choice.finish_reason) out.dataset.finish = choice.finish_reason;
          out.dataset.chunks = String(Number(out.dataset.chunks) + 1);
        }
      } catch (e) {
        if (e.name !== "AbortError") showError(e.message);
      } finally {
        out.dataset.done = "1";
      }
    });
  }

  // ---- wiring ---------------------------------------------------------------------------
  function wire() {
    const stored = localStorage.getItem(KEY_STORE);
    if (stored !== null) {
      $("api-key").value = stored;
      $("remember-key").checked = true;
    }
    $("connect").addEventListener("click", connect);
    $("api-key").addEventListener("keydown", (e) => { if (e.key === "Enter") connect(); });
    for (const tab of document.querySelectorAll(".tab")) {
      tab.addEventListener("click", () => {
        for (const t of document.querySelectorAll(".tab")) {
          t.classList.toggle("active", t === tab);
          $(t.dataset.panel).hidden = t !== tab;
        }
      });
    }
    $("p-mode").addEventListener("change", () => {
      $("mode-json").hidden = $("p-mode").value !== "json_schema";
      $("mode-tools").hidden = $("p-mode").value !== "tools";
    });
    $("chat-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const text = $("chat-input").value.trim();
      if (!text || state.controller) return;
      $("chat-input").value = "";
      sendChat(text);
    });
    $("chat-input").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        $("chat-form").requestSubmit();
      }
    });
    for (const id of ["chat-stop", "comp-stop"]) {
      $(id).addEventListener("click", () => state.controller && state.controller.abort());
    }
    $("chat-clear").addEventListener("click", () => {
      state.history = [];
      $("chat-log").replaceChildren();
    });
    $("comp-run").addEventListener("click", () => { if (!state.controller) runCompletion(); });
    connect();
  }

  window.vllmPlayground = { authHeaders };
  wire();
})();
