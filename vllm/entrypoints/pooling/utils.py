"""Encoding the pooling routes' outputs (upstream:
vllm/entrypoints/pooling/utils.py).

`encoding_format`:
- "float": the values as JSON numbers (a list, or a list of rows);
- "base64": the base64 text of tensor2binary's bytes (`embed_dtype`,
  `endianness`; float32 little-endian on x86 by default, what the `openai`
  client decodes);
- "bytes": an application/octet-stream body, every output's bytes one after
  another, and a `metadata` header (JSON): `{id, created, model, usage,
  data: [{index, embed_dtype, endianness, start, end, shape}]}` where
  `body[start:end]` are output `index`'s bytes and `shape` its tensor shape;
- "bytes_only": the same body without the header.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from fastapi.responses import Response

from vllm.entrypoints.openai.protocol_base import UsageInfo
from vllm.outputs import PoolingRequestOutput
from vllm.utils.serial_utils import EmbedDType, Endianness, binary2tensor, tensor2binary

JsonEncodingFormat = Literal["float", "base64"]
BytesEncodingFormat = Literal["bytes", "bytes_only"]
JsonEncodedPoolingOutput = list[float] | list[list[float]] | str


@dataclass
class MetadataItem:
    index: int
    embed_dtype: EmbedDType
    endianness: Endianness
    start: int
    end: int
    shape: tuple[int, ...]


def encode_pooling_output(
    data: torch.Tensor,
    encoding_format: JsonEncodingFormat,
    embed_dtype: EmbedDType,
    endianness: Endianness,
) -> JsonEncodedPoolingOutput:
    """One output for a JSON body: floats, or base64 of its bytes."""
    if encoding_format == "float":
        values: list[float] | list[list[float]] = data.float().tolist()
        return values
    raw = tensor2binary(data, embed_dtype, endianness)
    return base64.b64encode(raw).decode("ascii")


def get_pooling_usage(outputs: Sequence[PoolingRequestOutput[Any]]) -> UsageInfo:
    tokens = sum(len(out.prompt_token_ids or ()) for out in outputs)
    return UsageInfo(prompt_tokens=tokens, total_tokens=tokens)


def encode_pooling_bytes(
    outputs: Sequence[PoolingRequestOutput[Any]],
    embed_dtype: EmbedDType,
    endianness: Endianness,
) -> tuple[bytes, list[dict[str, Any]]]:
    """All outputs' bytes back to back, and where each one lies."""
    body: list[bytes] = []
    items: list[dict[str, Any]] = []
    offset = 0
    for index, out in enumerate(outputs):
        raw = tensor2binary(out.outputs.data, embed_dtype, endianness)
        items.append(
            {
                "index": index,
                "embed_dtype": embed_dtype,
                "endianness": endianness,
                "start": offset,
                "end": offset + len(raw),
                "shape": list(out.outputs.data.shape),
            }
        )
        body.append(raw)
        offset += len(raw)
    return b"".join(body), items


def build_pooling_bytes_response(
    outputs: Sequence[PoolingRequestOutput[Any]],
    request_id: str,
    created_time: int,
    model_name: str,
    encoding_format: BytesEncodingFormat,
    embed_dtype: EmbedDType,
    endianness: Endianness,
) -> Response:
    body, items = encode_pooling_bytes(outputs, embed_dtype, endianness)
    headers = None
    if encoding_format == "bytes":
        usage = get_pooling_usage(outputs)
        metadata = {
            "id": request_id,
            "created": created_time,
            "model": model_name,
            "data": items,
            "usage": {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.total_tokens},
        }
        headers = {"metadata": json.dumps(metadata)}
    return Response(content=body, headers=headers, media_type="application/octet-stream")


def decode_pooling_output(items: list[MetadataItem], body: bytes) -> list[torch.Tensor]:
    """A client's side of "bytes": the tensors, in index order."""
    return [
        binary2tensor(body[it.start : it.end], it.shape, it.embed_dtype, it.endianness)
        for it in sorted(items, key=lambda it: it.index)
    ]
