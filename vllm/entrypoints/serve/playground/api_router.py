"""GET / (the playground page) and GET /playground/<asset> (its script and
style sheet): static files read from this package.

These paths are in the API-key allow-list (`PLAYGROUND_PATHS`, joined into
vllm/entrypoints/serve/utils/server_utils.py:UNGUARDED_PATHS): a browser
cannot send a Bearer header when it loads a page, and the page holds nothing
but code. Everything the page does goes through the guarded routes.

The page's Content-Security-Policy allows its own origin only, so a page
that tried to load or call anything elsewhere would be stopped by the
browser itself (tests/entrypoints/test_playground.py also watches every
request the browser makes).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import Response

PACKAGE_DIR = Path(__file__).resolve().parent

# Asset name -> media type. Only these files are served (no path from the URL
# ever reaches the file system).
ASSETS: dict[str, str] = {
    "app.js": "text/javascript; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
ASSET_PREFIX = "/playground/"
PLAYGROUND_PATHS = frozenset({"/", *(ASSET_PREFIX + name for name in ASSETS)})

# 'self' only: no script, style, image or connection to another origin; no
# inline script or style either; never framed.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}

router = APIRouter()


@cache
def _read(name: str) -> bytes:
    return (PACKAGE_DIR / name).read_bytes()


@router.get("/", response_class=Response, include_in_schema=False)
async def playground_page() -> Response:
    return Response(_read("index.html"), media_type="text/html; charset=utf-8", headers=HEADERS)


def _asset_route(name: str, media_type: str) -> None:
    async def asset() -> Response:
        return Response(_read(name), media_type=media_type, headers=HEADERS)

    router.add_api_route(
        ASSET_PREFIX + name,
        asset,
        methods=["GET"],
        response_class=Response,
        include_in_schema=False,
        name=f"playground_{name.replace('.', '_')}",
    )


for _name, _media_type in ASSETS.items():
    _asset_route(_name, _media_type)


def attach_router(app: FastAPI) -> None:
    app.include_router(router)
