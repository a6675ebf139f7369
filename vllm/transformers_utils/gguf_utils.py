"""A fast reader for GGUF files: metadata, tensor index and tensor data.

`gguf.GGUFReader` builds a Python object for every element of every metadata
array, and a GGUF file's tokenizer arrays hold ~100k strings, so opening the
embedded 135M model took seconds (twice: once for the config, once for the
weights). This reader walks the same layout but only decodes scalars and
short arrays; long arrays are skipped with a length-prefix walk (strings) or
one multiplication (numbers). Tensor data is a memory map, dequantized per
tensor with the `gguf` package.

Layout (GGUF v2/v3, little-endian):
    "GGUF" | u32 version | u64 n_tensors | u64 n_kv
    n_kv x (string key | u32 value_type | value)
    n_tensors x (string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset)
    padding to `general.alignment` (default 32) | tensor data (offsets relative to here)
A string is u64 length + UTF-8 bytes; an array is u32 elem_type + u64 count +
elements. GGML dims are innermost-first: HF shape = reversed(dims).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

# value type -> (struct format, size) for scalar types
_SCALARS = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_STRING, _ARRAY = 8, 9
# Arrays longer than this are skipped, not decoded (vocabularies, merges).
_MAX_DECODED_ARRAY = 4096


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    shape: tuple[int, ...]  # HF order: [out, in] for a weight matrix
    ggml_type: int
    offset: int  # absolute byte offset in the file


@dataclass
class GGUFFile:
    path: str
    metadata: dict[str, Any]  # long arrays appear as ("<array>", count)
    tensors: list[GGUFTensorInfo]

    @property
    def architecture(self) -> str:
        return self.metadata["general.architecture"]

    def tensor_data(self, info: GGUFTensorInfo) -> np.ndarray:
        """The tensor dequantized to a float32 array of shape `info.shape`."""
        import gguf

        qtype = gguf.GGMLQuantizationType(info.ggml_type)
        byte_shape = gguf.quant_shape_to_byte_shape(info.shape, qtype)
        nbytes = int(np.prod(byte_shape))
        raw = np.memmap(
            self.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(nbytes,)
        ).reshape(byte_shape)
        if qtype == gguf.GGMLQuantizationType.F32:
            return np.array(raw.view(np.float32).reshape(info.shape))
        if qtype == gguf.GGMLQuantizationType.F16:
            return raw.view(np.float16).reshape(info.shape).astype(np.float32)
        return np.asarray(gguf.dequantize(raw, qtype), dtype=np.float32).reshape(info.shape)


class _Cursor:
    def __init__(self, buf: memoryview) -> None:
        self.buf, self.pos = buf, 0

    def scalar(self, vtype: int) -> Any:
        fmt, size = _SCALARS[vtype]
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        (n,) = struct.unpack_from("<Q", self.buf, self.pos)
        s = bytes(self.buf[self.pos + 8 : self.pos + 8 + n]).decode("utf-8", errors="replace")
        self.pos += 8 + n
        return s

    def skip_strings(self, count: int) -> None:
        unpack, buf, pos = struct.unpack_from, self.buf, self.pos
        for _ in range(count):
            pos += 8 + unpack("<Q", buf, pos)[0]
        self.pos = pos

    def value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            return self.scalar(vtype)
        etype, count = self.scalar(4), self.scalar(10)
        if count > _MAX_DECODED_ARRAY:
            if etype == _STRING:
                self.skip_strings(count)
            else:
                self.pos += count * _SCALARS[etype][1]
            return ("<array>", count)
        return [self.value(etype) for _ in range(count)]


@lru_cache(maxsize=4)
def read_gguf(path: str) -> GGUFFile:
    """Parse the header, metadata and tensor index of a GGUF file; a file cut
    short (in its header, or before the end of a tensor's data) is refused
    with a ValueError naming it."""
    try:
        gguf_file = _parse_gguf(path)
    except (struct.error, KeyError, IndexError) as e:
        raise ValueError(f"{path} is truncated or corrupt (unreadable GGUF header: {e}).") from e
    size = os.path.getsize(path)
    for info in gguf_file.tensors:
        end = info.offset + _tensor_nbytes(info)
        if end > size:
            raise ValueError(
                f"{path} is truncated or corrupt: tensor {info.name} ends at byte {end}, "
                f"past the end of the file ({size} bytes)."
            )
    return gguf_file


def _tensor_nbytes(info: GGUFTensorInfo) -> int:
    import gguf

    try:
        qtype = gguf.GGMLQuantizationType(info.ggml_type)
    except ValueError:
        return 0  # an unknown type: refused by name where it is used
    return int(np.prod(gguf.quant_shape_to_byte_shape(info.shape, qtype)))


def _parse_gguf(path: str) -> GGUFFile:
    with open(path, "rb") as f:
        # Metadata + tensor index sit at the front; 64 MiB covers large vocabularies.
        head = f.read(64 << 20)
    cur = _Cursor(memoryview(head))
    if bytes(head[:4]) != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file.")
    cur.pos = 4
    version = cur.scalar(4)
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} of {path} is not supported.")
    n_tensors, n_kv = cur.scalar(10), cur.scalar(10)
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar(4))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.scalar(10) for _ in range(cur.scalar(4))]
        ggml_type, offset = cur.scalar(4), cur.scalar(10)
        infos.append((name, tuple(reversed(dims)), ggml_type, offset))
    align = int(metadata.get("general.alignment", 32))
    data_start = -(cur.pos // -align) * align
    tensors = [GGUFTensorInfo(n, s, t, data_start + o) for n, s, t, o in infos]
    return GGUFFile(path, metadata, tensors)


# GGUF architecture -> (HF model_type, architecture)
_HF_ARCHS = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
}


def gguf_hf_config(path: str):
    """An HF PretrainedConfig built from a GGUF file's metadata."""
    from transformers import AutoConfig

    g = read_gguf(path)
    arch = g.architecture
    if arch not in _HF_ARCHS:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported; supported: {sorted(_HF_ARCHS)}."
        )
    m = g.metadata
    model_type, hf_arch = _HF_ARCHS[arch]
    tokens = m.get("tokenizer.ggml.tokens")
    vocab = m.get(f"{arch}.vocab_size") or (
        tokens[1] if isinstance(tokens, tuple) else len(tokens or [])
    )
    heads = m[f"{arch}.attention.head_count"]
    hidden = m[f"{arch}.embedding_length"]
    kwargs = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=m[f"{arch}.feed_forward_length"],
        num_hidden_layers=m[f"{arch}.block_count"],
        num_attention_heads=heads,
        num_key_value_heads=m.get(f"{arch}.attention.head_count_kv", heads),
        max_position_embeddings=m.get(f"{arch}.context_length", 2048),
        rms_norm_eps=m.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=m.get(f"{arch}.rope.freq_base", 10000.0),
        head_dim=m.get(f"{arch}.attention.key_length", hidden // heads),
        bos_token_id=m.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=m.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=m.get("tokenizer.ggml.padding_token_id"),
        # No separate output matrix: the LM head shares the embedding.
        tie_word_embeddings=not any(t.name == "output.weight" for t in g.tensors),
        architectures=[hf_arch],
    )
    return AutoConfig.for_model(model_type, **kwargs)
