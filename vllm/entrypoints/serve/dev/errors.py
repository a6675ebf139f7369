"""The error response of the operator routes (one module, so that the routers
do not import their package, which mounts them)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from vllm.entrypoints.openai.protocol import ErrorInfo, ErrorResponse


def error_response(
    message: str,
    status_code: int = 400,
    err_type: str = "BadRequestError",
    param: str | None = None,
) -> JSONResponse:
    """Upstream's error envelope."""
    body = ErrorResponse(
        error=ErrorInfo(message=message, type=err_type, param=param, code=status_code)
    )
    return JSONResponse(body.model_dump(), status_code=status_code)
