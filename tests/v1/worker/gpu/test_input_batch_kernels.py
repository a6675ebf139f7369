"""Each Triton kernel of Model Runner V2 (input preparation, slot mappings,
staged writes, Gumbel sampling) against its torch path and a plain-Python
reference, under Triton's CPU interpreter (see kernel_checks.py)."""

import pytest

from tests.v1.worker.gpu.kernel_checks import CHECKS, run_checks


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    # One interpreter subprocess for all checks (Triton reads TRITON_INTERPRET
    # when the kernels are defined, so it cannot be switched on in this process).
    return run_checks(list(CHECKS))


@pytest.mark.parametrize("name", list(CHECKS))
def test_triton_kernel_matches_torch_path(results, name):
    assert results[name] == "ok", results[name]
