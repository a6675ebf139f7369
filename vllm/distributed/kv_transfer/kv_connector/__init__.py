"""KV transfer between instances (upstream: vllm/distributed/kv_transfer/).
Connectors are not built; only the records that outputs and stats carry."""
