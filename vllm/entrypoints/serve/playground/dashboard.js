// The live engine dashboard: reads this server's /metrics (Prometheus text,
// upstream's vllm:* names, one series per engine via the `engine` label) once
// a second, derives rates and latency percentiles from consecutive samples,
// and draws small canvas charts of the last two minutes. /metrics is behind
// --api-key like the model routes: the key comes from app.js.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const PERIOD_MS = 1000;
  const HISTORY_S = 120; // chart span
  const WINDOW_S = 60; // latency percentiles over the last minute
  const RATE_S = 5; // tokens/s and hit rate over the last few seconds (steps are bursty)
  const COLORS = ["#3b82f6", "#f59e0b", "#10b981", "#ef4444", "#8b5cf6", "#14b8a6", "#ec4899", "#84cc16"];
  const samples = []; // {t (seconds), m (parsed metrics)}
  const series = { requests: [], tokens: [], kv: [], hit: [], latency: [] }; // {t, values[]}

  // ---- the Prometheus text format ------------------------------------------------
  const LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\S+)?$/;
  const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

  function parseValue(raw) {
    if (raw === "+Inf") return Infinity;
    if (raw === "-Inf") return -Infinity;
    return Number(raw);
  }

  // -> Map name -> [{labels, value}]
  function parseMetrics(text) {
    const metrics = new Map();
    for (const line of text.split("\n")) {
      if (!line || line.startsWith("#")) continue;
      const m = LINE.exec(line.trim());
      if (!m) continue;
      const labels = {};
      for (const l of (m[2] || "").matchAll(LABEL)) {
        labels[l[1]] = l[2].replace(/\\n/g, "\n").replace(/\\(.)/g, "$1");
      }
      if (!metrics.has(m[1])) metrics.set(m[1], []);
      metrics.get(m[1]).push({ labels, value: parseValue(m[3]) });
    }
    return metrics;
  }

  // Sum of a metric's samples, over every engine or one.
  function total(metrics, name, engine) {
    let sum = 0;
    for (const s of metrics.get(name) || []) {
      if (engine === undefined || s.labels.engine === engine) sum += s.value;
    }
    return sum;
  }

  function engines(metrics) {
    const names = new Set((metrics.get("vllm:num_requests_running") || []).map((s) => s.labels.engine));
    return [...names].filter((e) => e !== undefined).sort((a, b) => Number(a) - Number(b));
  }

  // Cumulative bucket counts of a histogram summed over engines: [[le, count]] by le.
  function buckets(metrics, name) {
    const byLe = new Map();
    for (const s of metrics.get(name + "_bucket") || []) {
      const le = parseValue(s.labels.le);
      byLe.set(le, (byLe.get(le) || 0) + s.value);
    }
    return [...byLe.entries()].sort((a, b) => a[0] - b[0]);
  }

  // Prometheus' histogram_quantile: linear inside the bucket holding the rank.
  function quantile(q, cumulative) {
    const count = cumulative.length ? cumulative[cumulative.length - 1][1] : 0;
    if (!(count > 0)) return null;
    const rank = q * count;
    let prevLe = 0, prevCount = 0;
    for (const [le, c] of cumulative) {
      if (c >= rank) {
        if (le === Infinity) return prevLe;
        if (c === prevCount) return le;
        return prevLe + (le - prevLe) * ((rank - prevCount) / (c - prevCount));
      }
      prevLe = le;
      prevCount = c;
    }
    return prevLe;
  }

  function minus(now, before) {
    const old = new Map(before);
    return now.map(([le, c]) => [le, Math.max(0, c - (old.get(le) || 0))]);
  }

  // ---- derived values ---------------------------------------------------------------
  // Per-second rate of a counter between two samples (a restart reads as 0).
  function rate(name, now, prev, engine) {
    if (!prev) return null;
    const dt = now.t - prev.t;
    const d = total(now.m, name, engine) - total(prev.m, name, engine);
    return dt > 0 && d >= 0 ? d / dt : 0;
  }

  function hitRate(now, prev, engine) {
    const base = prev ? prev.m : new Map();
    const q = total(now.m, "vllm:prefix_cache_queries_total", engine) - total(base, "vllm:prefix_cache_queries_total", engine);
    const h = total(now.m, "vllm:prefix_cache_hits_total", engine) - total(base, "vllm:prefix_cache_hits_total", engine);
    return q > 0 ? h / q : null;
  }

  // Latency histograms over the last WINDOW_S, or all time when the window
  // saw no request: {label, ttft: [p50, p90, p99], tpot: [...]} in seconds.
  function latency(now) {
    const base = samples.find((s) => s.t >= now.t - WINDOW_S);
    const tpotName = now.m.has("vllm:request_time_per_output_token_seconds_bucket")
      ? "vllm:request_time_per_output_token_seconds" : "vllm:inter_token_latency_seconds";
    let ttft = buckets(now.m, "vllm:time_to_first_token_seconds");
    let tpot = buckets(now.m, tpotName);
    let label = "all time";
    if (base && base !== now) {
      const wTtft = minus(ttft, buckets(base.m, "vllm:time_to_first_token_seconds"));
      if (wTtft.length && wTtft[wTtft.length - 1][1] > 0) {
        ttft = wTtft;
        tpot = minus(tpot, buckets(base.m, tpotName));
        label = `last ${WINDOW_S} s`;
      }
    }
    const qs = [0.5, 0.9, 0.99];
    return { label, ttft: qs.map((q) => quantile(q, ttft)), tpot: qs.map((q) => quantile(q, tpot)) };
  }

  // ---- display -----------------------------------------------------------------------
  function fmt(value, digits) {
    if (value === null || value === undefined || Number.isNaN(value)) return "–";
    return value.toLocaleString(undefined, { maximumFractionDigits: digits, minimumFractionDigits: 0 });
  }

  function pct(value) {
    return value === null || value === undefined ? "–" : `${fmt(100 * value, 1)}%`;
  }

  function ms(seconds) {
    return seconds === null ? "–" : `${fmt(1000 * seconds, 1)} ms`;
  }

  // textContent for people, data-value (the raw number) for tests and scripts.
  function show(id, text, value) {
    const el = $(id);
    el.textContent = text;
    el.dataset.value = value === null || value === undefined ? "" : String(value);
  }

  // The sample RATE_S before `now` (or the oldest there is).
  function rateBase(now) {
    let base = null;
    for (const s of samples) {
      if (s === now || s.t > now.t - RATE_S) break;
      base = s;
    }
    return base || (samples[0] !== now ? samples[0] : null);
  }

  function render(now) {
    const prev = rateBase(now);
    const m = now.m;
    const running = total(m, "vllm:num_requests_running");
    const waiting = total(m, "vllm:num_requests_waiting");
    const list = engines(m);
    const kvs = list.map((e) => total(m, "vllm:kv_cache_usage_perc", e));
    const kv = kvs.length ? kvs.reduce((a, b) => a + b, 0) / kvs.length : null;
    const hitAll = hitRate(now, null);
    const hitNow = hitRate(now, prev);
    const promptTps = rate("vllm:prompt_tokens_total", now, prev);
    const genTps = rate("vllm:generation_tokens_total", now, prev);
    show("m-running", fmt(running, 0), running);
    show("m-waiting", fmt(waiting, 0), waiting);
    show("m-kv", pct(kv), kv);
    show("m-hit", pct(hitAll), hitAll);
    show("m-prompt-tps", fmt(promptTps, 1), promptTps);
    show("m-gen-tps", fmt(genTps, 1), genTps);
    const done = total(m, "vllm:request_success_total");
    show("m-done", fmt(done, 0), done);
    const gen = total(m, "vllm:generation_tokens_total");
    show("m-gen-total", fmt(gen, 0), gen);
    const lat = latency(now);
    $("lat-window").textContent = `latency (${lat.label})`;
    ["p50", "p90", "p99"].forEach((p, i) => {
      show(`ttft-${p}`, ms(lat.ttft[i]), lat.ttft[i]);
      show(`tpot-${p}`, ms(lat.tpot[i]), lat.tpot[i]);
    });
    renderEngines(now, prev, list);
    push("requests", now.t, [running, waiting]);
    push("tokens", now.t, [genTps, promptTps]);
    push("kv", now.t, kvs.map((v) => 100 * v));
    push("hit", now.t, [hitNow === null ? null : 100 * hitNow]);
    push("latency", now.t, [lat.ttft[0] === null ? null : 1000 * lat.ttft[0], lat.tpot[0] === null ? null : 1000 * lat.tpot[0]]);
    drawAll(now.t);
  }

  // One row per engine when there are several (data parallelism).
  function renderEngines(now, prev, list) {
    const table = $("engines");
    table.hidden = list.length < 2;
    if (table.hidden) return;
    const rows = list.map((e) => {
      const tr = document.createElement("tr");
      tr.dataset.engine = e;
      const cells = [e, fmt(total(now.m, "vllm:num_requests_running", e), 0),
        fmt(total(now.m, "vllm:num_requests_waiting", e), 0),
        pct(total(now.m, "vllm:kv_cache_usage_perc", e)), pct(hitRate(now, null, e)),
        fmt(rate("vllm:generation_tokens_total", now, prev, e), 1)];
      for (const c of cells) tr.insertCell().textContent = c;
      return tr;
    });
    table.tBodies[0].replaceChildren(...rows);
  }

  // ---- charts --------------------------------------------------------------------------
  function push(name, t, values) {
    const s = series[name];
    s.push({ t, values });
    while (s.length && s[0].t < t - HISTORY_S) s.shift();
  }

  // Fixed-range charts (percentages) keep their 0-100 scale.
  const FIXED_MAX = { kv: 100, hit: 100 };

  function drawAll(now) {
    for (const name of Object.keys(series)) draw($(`chart-${name}`), series[name], now, FIXED_MAX[name]);
  }

  function draw(canvas, points, now, fixedMax) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth, h = canvas.clientHeight;
    if (canvas.width !== Math.round(w * dpr)) canvas.width = Math.round(w * dpr);
    if (canvas.height !== Math.round(h * dpr)) canvas.height = Math.round(h * dpr);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    let max = fixedMax || 0;
    for (const p of points) for (const v of p.values) if (v !== null && v > max) max = v;
    max = fixedMax || niceCeil(max);
    const x = (t) => w - ((now - t) / HISTORY_S) * w;
    const y = (v) => h - 2 - (v / max) * (h - 14);
    ctx.strokeStyle = "rgba(128,128,128,0.25)";
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(0, y(max));
    ctx.lineTo(w, y(max));
    ctx.moveTo(0, y(max / 2));
    ctx.lineTo(w, y(max / 2));
    ctx.stroke();
    ctx.fillStyle = "rgba(128,128,128,0.9)";
    ctx.font = "10px sans-serif";
    ctx.fillText(fmt(max, 2), 2, 10);
    const lines = points.reduce((n, p) => Math.max(n, p.values.length), 0);
    for (let i = 0; i < lines; i++) {
      ctx.strokeStyle = COLORS[i % COLORS.length];
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      let pen = false;
      for (const p of points) {
        const v = p.values[i];
        if (v === null || v === undefined) { pen = false; continue; }
        if (pen) ctx.lineTo(x(p.t), y(v));
        else ctx.moveTo(x(p.t), y(v));
        pen = true;
      }
      ctx.stroke();
    }
  }

  function niceCeil(v) {
    if (!(v > 0)) return 1;
    const step = Math.pow(10, Math.floor(Math.log10(v)));
    for (const k of [1, 2, 5, 10]) if (k * step >= v) return k * step;
    return 10 * step;
  }

  // ---- polling ---------------------------------------------------------------------------
  async function poll() {
    const status = $("dash-status");
    try {
      const headers = window.vllmPlayground ? window.vllmPlayground.authHeaders() : {};
      const resp = await fetch("metrics", { headers, cache: "no-store" });
      if (resp.status === 401) {
        status.textContent = "401: /metrics needs the API key";
        status.dataset.state = "error";
      } else if (!resp.ok) {
        status.textContent = `/metrics: ${resp.status} ${resp.statusText}`;
        status.dataset.state = "error";
      } else {
        const now = { t: performance.now() / 1000, m: parseMetrics(await resp.text()) };
        samples.push(now);
        while (samples.length && samples[0].t < now.t - HISTORY_S) samples.shift();
        render(now);
        status.textContent = `live · ${engines(now.m).length || 1} engine(s)`;
        status.dataset.state = "ok";
        status.dataset.samples = String(Number(status.dataset.samples || 0) + 1);
      }
    } catch (e) {
      status.textContent = `/metrics unreachable: ${e.message}`;
      status.dataset.state = "error";
    }
    setTimeout(poll, PERIOD_MS);
  }

  poll();
})();
