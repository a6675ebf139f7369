"""Speculative decoding (upstream: vllm/v1/spec_decode/).

Foundations only, not wired into the engine (`SpeculativeConfig` still refuses
speculation): `ngram_proposer.py: NgramProposer`, prompt-lookup drafts computed
for the whole batch in one vectorised numpy pass.
"""
