"""POST /v1/load_lora_adapter and /v1/unload_lora_adapter (upstream:
vllm/entrypoints/serve/lora/), registered only with
VLLM_ALLOW_RUNTIME_LORA_UPDATING set. The adapters themselves live in
`OpenAIServingModels` (vllm/entrypoints/openai/serving_models.py)."""
