"""LoRA (upstream: vllm/lora/). Only the request record is here: LoRA itself
is not built, and the engine refuses a request that names an adapter."""
