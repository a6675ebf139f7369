"""Shared helpers for the front-end tests: tokenizers and hand-made requests."""

from __future__ import annotations

import pytest

from vllm.sampling_params import SamplingParams
from vllm.v1.engine import EngineCoreRequest


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
    """Byte-level BPE trained on ASCII text: every non-ASCII character is split
    over several single-byte tokens, the hard case for incremental decoding."""
    from tests.utils import make_tiny_tokenizer
    from vllm.transformers_utils.tokenizer import get_tokenizer

    path = tmp_path_factory.mktemp("tok")
    make_tiny_tokenizer(str(path))
    return get_tokenizer(str(path))


@pytest.fixture(scope="session")
def gguf_tokenizer(embedded_model_path):
    """The embedded SmolLM2 model's tokenizer, read from its GGUF metadata."""
    from vllm.transformers_utils.tokenizer import get_tokenizer

    return get_tokenizer(embedded_model_path)


def make_request(
    prompt_ids: list[int], request_id: str = "r0", external_req_id: str | None = None, **params
) -> EngineCoreRequest:
    return EngineCoreRequest(
        request_id=request_id,
        prompt_token_ids=prompt_ids,
        mm_features=None,
        sampling_params=SamplingParams(**params),
        pooling_params=None,
        eos_token_id=None,
        arrival_time=0.0,
        lora_request=None,
        cache_salt=None,
        data_parallel_rank=None,
        external_req_id=external_req_id,
    )
