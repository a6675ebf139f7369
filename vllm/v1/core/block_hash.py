"""Block hashes, the keys of the prefix cache (imported from
`vllm.v1.core.kv_cache_utils`, upstream's module for them, which computes them).

The types and the key packing only, so that the request and the KV cache
events can name them without importing the hashing and the KV cache planning
that kv_cache_utils brings along (kv_cache_utils also hashes requests, so the
request importing it would be an import cycle).
"""

from typing import NewType

# The hash of one full block of tokens, chained over every block before it, so
# equal hashes mean equal prefixes. A distinct type from `bytes` to catch
# accidental mixing with other byte strings.
BlockHash = NewType("BlockHash", bytes)

# A `BlockHash` followed by the 4-byte big-endian id of its KV cache group: the
# key of the prefix cache. Kept as flat bytes (no tuple) to keep the cache dict
# small and cheap to hash.
BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)

# A block hash as KV cache events publish it: the low 64 bits as an int
# (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1, the default) or the raw bytes.
ExternalBlockHash = bytes | int


def maybe_convert_block_hash(hash_bytes: BlockHash) -> ExternalBlockHash:
    from vllm import envs

    if not envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES:
        return hash_bytes
    return int.from_bytes(hash_bytes, byteorder="big") & ((1 << 64) - 1)


def make_block_hash_with_group_id(block_hash: BlockHash, group_id: int) -> BlockHashWithGroupId:
    """Pack a block hash and a KV cache group id into one cache key."""
    return BlockHashWithGroupId(block_hash + group_id.to_bytes(4, "big", signed=False))


def get_block_hash(key: BlockHashWithGroupId) -> BlockHash:
    """The `BlockHash` part of a cache key."""
    return BlockHash(key[:-4])


def get_group_id(key: BlockHashWithGroupId) -> int:
    """The KV cache group id part of a cache key."""
    return int.from_bytes(key[-4:], "big", signed=False)
