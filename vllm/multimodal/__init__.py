"""Multimodal inputs (upstream: vllm/multimodal/). Only the data contracts that
requests carry are here; multimodal inputs themselves are not built, and the
engine refuses a request that has them (`InputProcessor`, `Scheduler`)."""
