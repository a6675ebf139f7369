"""Workers and model runners (upstream: vllm/v1/worker/)."""
