"""Token sampling for the V1 model runner (upstream: vllm/v1/sample/)."""
