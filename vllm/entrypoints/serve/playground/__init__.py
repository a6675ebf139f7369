"""The browser playground and live engine dashboard at `/` (beyond upstream,
issue 23 item 2; off with `--disable-playground`).

Plain static files shipped in this package (index.html, app.js, dashboard.js,
style.css: no build step, no CDN, nothing fetched from elsewhere) and the
router that serves them (`api_router.py`). The page talks only to the
server's public API (/v1/models, /v1/chat/completions, /v1/completions) and
/metrics, sending the API key the user types in as `Authorization: Bearer`:
with `--api-key` the page itself loads (it holds no data) but every call it
makes is refused 401 until the key is given.
"""
