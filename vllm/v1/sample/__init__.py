"""Token sampling for the V1 model runner (upstream: vllm/v1/sample/).

`sampler.py: Sampler`: logits processors (`logits_processor/`: min_tokens,
logit bias), penalties and bad words (`ops/`), then greedy, or temperature,
min-p and top-k / top-p sampling (`ops/topk_topp_sampler.py`, with a
generator per seeded request), and the logprobs of the sampled tokens;
`metadata.py`: the per-step `SamplingMetadata` the runner builds.
"""
