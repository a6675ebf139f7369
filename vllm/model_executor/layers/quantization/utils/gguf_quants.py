"""GGUF quantized blocks -> integer values and per-group scales / offsets, in torch.

GGUF (ggml) stores a quantized [N, K] matrix row by row; each row is K / B
blocks of `type_size` bytes, each block covering B consecutive elements.
`decode_gguf_rows` turns the raw bytes of whole rows into the form the int8
group GEMM takes (`vllm._custom_ops.int8_group_gemm`):

    w[n, k] = q[n, k] * scale[n, k // g] (+ offset[n, k // g])

with q int8, scale / offset float32 and g the type's sub-block size (32 or
16). Every float product below is the one ggml (and gguf-py's numpy
`dequantize`) computes, in float32, so q * scale + offset reproduces
`gguf.dequantize` bit for bit.

Block layouts (little-endian; f16 = IEEE half; "nibble j" of 16 bytes qs:
j < 16 -> qs[j] & 0xF, j >= 16 -> qs[j - 16] >> 4):
  Q4_0 (32, 18 B): d f16 | qs 16 B nibbles             w = d * (nibble - 8)
  Q4_1 (32, 20 B): d f16 | m f16 | qs 16 B             w = d * nibble + m
  Q5_0 (32, 22 B): d f16 | qh u32 | qs 16 B            q = nibble | (bit j of qh) << 4;
                                                       w = d * (q - 16)
  Q5_1 (32, 24 B): d f16 | m f16 | qh u32 | qs 16 B    w = d * q + m
  Q8_0 (32, 34 B): d f16 | qs 32 x int8                w = d * qs
  Q2_K (256, 84 B): scales 16 B (lo nibble scale, hi nibble min, per 16) | qs 64 B
       (2 bits: element h*128 + s*32 + j is bits 2s of qs[h*32 + j]) | d f16 | dmin f16
       w = d * sc * q - dmin * mn
  Q3_K (256, 110 B): hmask 32 B (element b*32 + j: bit b of hmask[j], 0 means -4) |
       qs 64 B (low 2 bits as Q2_K) | scales 12 B (16 x 6 bits, minus 32) | d f16
  Q4_K (256, 144 B): d f16 | dmin f16 | scales 12 B (8 x 6-bit scale, 8 x 6-bit min) |
       qs 128 B (element c*64 + h*32 + j: nibble h of qs[c*32 + j])  w = d*sc*q - dmin*mn
  Q5_K (256, 176 B): d | dmin | scales 12 B | qh 32 B (bit b of qh[j] -> element b*32 + j) |
       qs 128 B as Q4_K
  Q6_K (256, 210 B): ql 128 B (element h*128 + n*64 + j: nibble n of ql[h*64 + j]) |
       qh 64 B (element h*128 + s*32 + j: bits 2s of qh[h*32 + j]) | scales 16 x int8 | d f16
       w = d * sc * (q - 32), per 16
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# ggml type ids (gguf.GGMLQuantizationType) of the dense and the quantized types built.
GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30
GGML_DENSE_TYPES = (GGML_F32, GGML_F16, GGML_BF16)
GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 30: "BF16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
    10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
}  # fmt: skip
# type -> (elements per block, bytes per block)
GGML_BLOCK_SIZES: dict[int, tuple[int, int]] = {
    0: (1, 4), 1: (1, 2), 30: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24),
    8: (32, 34), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
}  # fmt: skip
# Types whose values fit 4 bits (0..15 after the per-type shift), for the int4 kernel.
GGML_INT4_TYPES = (2, 3, 12)


def ggml_type_name(qtype: int) -> str:
    """ "Q4_K" for 12; the gguf package's name for types not built here."""
    if qtype in GGML_TYPE_NAMES:
        return GGML_TYPE_NAMES[qtype]
    try:
        import gguf

        return gguf.GGMLQuantizationType(qtype).name
    except (ImportError, ValueError):
        return f"ggml type {qtype}"


def gguf_row_bytes(qtype: int, k: int) -> int:
    """Bytes of one row of k elements; a ValueError when k is not whole blocks."""
    block, nbytes = GGML_BLOCK_SIZES[qtype]
    if k % block:
        raise ValueError(
            f"{ggml_type_name(qtype)} rows need a multiple of {block} elements, got {k}"
        )
    return k // block * nbytes


@dataclass
class GGUFDecoded:
    """w = q * scale[:, k // group_size] (+ offset[:, k // group_size])."""

    q: torch.Tensor  # int8 [N, K]
    scale: torch.Tensor  # float32 [N, K / group_size]
    offset: torch.Tensor | None  # float32 [N, K / group_size] or None (symmetric)
    group_size: int

    def dequantize(self) -> torch.Tensor:
        """The float32 [N, K] weight."""
        w = self.q.float().unflatten(1, (-1, self.group_size)) * self.scale.unsqueeze(-1)
        if self.offset is not None:
            w = w + self.offset.unsqueeze(-1)
        return w.flatten(1)


def _f16(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The f16 at byte `at` of each block, as float32 [nb, 1]."""
    return blocks[:, at : at + 2].contiguous().view(torch.float16).float()


def _shifts(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8)


def _nibbles(qs: torch.Tensor, chunk: int) -> torch.Tensor:
    """qs [nb, C * chunk] -> [nb, C, 2, chunk]: low nibbles of a chunk, then high."""
    qs = qs.unflatten(1, (-1, 1, chunk)) >> _shifts(0, 4).view(1, 1, 2, 1)
    return qs & 0x0F


def _bits(qh: torch.Tensor, nbits: int, chunk: int) -> torch.Tensor:
    """qh [nb, C * chunk] -> [nb, C, 8 / nbits, chunk]: field i is bits [i * nbits, +nbits)."""
    count = 8 // nbits
    shifts = _shifts(*range(0, 8, nbits)).view(1, 1, count, 1)
    return (qh.unflatten(1, (-1, 1, chunk)) >> shifts) & ((1 << nbits) - 1)


def _legacy_high_bit(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """Q5_0 / Q5_1: the u32 at byte `at` holds bit 4 of element j in bit j -> [nb, 32]."""
    qh = blocks[:, at : at + 4].contiguous().view(torch.int32)  # [nb, 1]
    return ((qh >> torch.arange(32, dtype=torch.int32)) & 1).to(torch.uint8)


def _q4_0(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    q = _nibbles(b[:, 2:18], 16).flatten(1).to(torch.int8) - 8
    return q, _f16(b, 0), None


def _q4_1(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    q = _nibbles(b[:, 4:20], 16).flatten(1).to(torch.int8)
    return q, _f16(b, 0), _f16(b, 2)


def _q5_0(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    q = _nibbles(b[:, 6:22], 16).flatten(1) | (_legacy_high_bit(b, 2) << 4)
    return q.to(torch.int8) - 16, _f16(b, 0), None


def _q5_1(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    q = _nibbles(b[:, 8:24], 16).flatten(1) | (_legacy_high_bit(b, 4) << 4)
    return q.to(torch.int8), _f16(b, 0), _f16(b, 2)


def _q8_0(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    return b[:, 2:34].contiguous().view(torch.int8), _f16(b, 0), None


def _k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K: 12 bytes -> 8 six-bit scales and 8 six-bit mins (float32 [nb, 8]).
    Bytes 0-3: scale j (low 6 bits), bytes 4-7: min j (low 6 bits); for j >= 4
    the low 4 bits come from byte 8 + j - 4 (scale) / its high nibble (min) and
    the top 2 bits from the top of byte j - 4 (scale) / byte j (min)."""
    d, m, md = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc.float(), mn.float()


def _q2_k(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    sc = b[:, 0:16]
    q = _bits(b[:, 16:80], 2, 32).flatten(1).to(torch.int8)
    scale = _f16(b, 80) * (sc & 0x0F).float()
    offset = -(_f16(b, 82) * (sc >> 4).float())
    return q, scale, offset


def _q3_k(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    low = _bits(b[:, 32:96], 2, 32).flatten(1).to(torch.int8)
    high = _bits(b[:, 0:32], 1, 32).flatten(1).to(torch.int8)
    q = low - ((1 - high) << 2)
    raw = b[:, 96:108]
    lo = (raw[:, 0:8].unsqueeze(1) >> _shifts(0, 4).view(1, 2, 1)).flatten(1) & 0x0F
    hi = (raw[:, 8:12].unsqueeze(1) >> _shifts(0, 2, 4, 6).view(1, 4, 1)).flatten(1) & 0x03
    sc = (lo | (hi << 4)).to(torch.int8) - 32
    return q, _f16(b, 108) * sc.float(), None


def _q4_k(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    sc, mn = _k_scale_min(b[:, 4:16])
    q = _nibbles(b[:, 16:144], 32).flatten(1).to(torch.int8)
    return q, _f16(b, 0) * sc, -(_f16(b, 2) * mn)


def _q5_k(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    sc, mn = _k_scale_min(b[:, 4:16])
    low = _nibbles(b[:, 48:176], 32).flatten(1)
    high = _bits(b[:, 16:48], 1, 32).flatten(1)
    q = (low | (high << 4)).to(torch.int8)
    return q, _f16(b, 0) * sc, -(_f16(b, 2) * mn)


def _q6_k(b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    low = _nibbles(b[:, 0:128], 64).flatten(1)
    high = _bits(b[:, 128:192], 2, 32).flatten(1)
    q = (low | (high << 4)).to(torch.int8) - 32
    sc = b[:, 192:208].contiguous().view(torch.int8).float()
    return q, _f16(b, 208) * sc, None


# type -> (decoder of [nb, type_size] blocks -> (q [nb, B], scale [nb, B/g], offset), g)
_Decoded = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]
_DECODERS: dict[int, tuple[Callable[[torch.Tensor], _Decoded], int]] = {
    2: (_q4_0, 32), 3: (_q4_1, 32), 6: (_q5_0, 32), 7: (_q5_1, 32), 8: (_q8_0, 32),
    10: (_q2_k, 16), 11: (_q3_k, 16), 12: (_q4_k, 32), 13: (_q5_k, 32), 14: (_q6_k, 16),
}  # fmt: skip
GGML_QUANT_TYPES = tuple(_DECODERS)


def gguf_group_size(qtype: int) -> int:
    """Elements sharing one scale (and offset) in the decoded form."""
    return _DECODERS[qtype][1]


def decode_gguf_rows(raw: torch.Tensor, qtype: int, k: int) -> GGUFDecoded:
    """raw uint8 [N, >= row bytes] (trailing padding ignored) of a `qtype`
    matrix with k columns -> its int8 values and float32 scales / offsets."""
    if qtype not in _DECODERS:
        raise ValueError(f"GGUF type {ggml_type_name(qtype)} has no decoder here")
    decode, group = _DECODERS[qtype]
    block, nbytes = GGML_BLOCK_SIZES[qtype]
    n = raw.shape[0]
    blocks = raw[:, : gguf_row_bytes(qtype, k)].reshape(-1, nbytes)
    q, scale, offset = decode(blocks)
    per_row = k // group
    return GGUFDecoded(
        q=q.reshape(n, k).contiguous(),
        scale=scale.reshape(n, per_row).contiguous(),
        offset=None if offset is None else offset.reshape(n, per_row).contiguous(),
        group_size=group,
    )
