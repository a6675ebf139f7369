"""Tensor ops used by the sampler."""
