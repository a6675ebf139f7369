"""LoRA (upstream: vllm/lora/). Built so far: the request record, LoRAConfig
(vllm/config/lora.py), peft adapter loading (peft_helper, lora_model,
lora_weights, utils) and the batched ops / Punica wrapper; the engine does
not run adapters yet and refuses a request that names one."""
