"""The paged KV cache of the engine core (upstream: vllm/v1/core/).

`KVCacheManager` (`kv_cache_manager.py`, what the scheduler calls) ->
`KVCacheCoordinator` (`kv_cache_coordinator.py`, one or several KV cache
groups) -> one single-type manager per group (`single_type_kv_cache_manager*.py`:
full attention, sliding window, Mamba, chunked local) -> `BlockPool`
(`block_pool.py`). Block hashing for the prefix cache: `kv_cache_utils.py`
(the hash types and cache keys alone: `block_hash.py`);
KV sizing (blocks from the memory the workers report, grouping of layer
specs, the max model length that fits): `kv_cache_planning.py`.
"""
