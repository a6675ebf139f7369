#!/usr/bin/env bash
# Run upstream vLLM v0.28's own CPU unit tests for the KV cache, prefix caching,
# the scheduler and the async scheduler against THIS package (not part of `make test`).
#
#   tools/run_upstream_core_tests.sh [WORKDIR] [-- extra pytest args]
#
# Downloads upstream's sdist (PyPI, the ordinary pip client) into WORKDIR
# (default /tmp/upstream), copies the test files out to WORKDIR/run (outside the
# repo, so `import vllm` is this checkout's editable install) and runs them.
# Two things stand in for upstream test infrastructure we do not have:
#  * tests/conftest.py: upstream's imports the whole model-test toolkit
#    (assets, HF runners); the tests here only need `caplog_vllm`.
#  * tests/v1/kv_connector/unit/utils.py: upstream's builds real KV connectors
#    (not built here); core/utils.py only needs its MockKVConfig record.
#    Tests that then ask for a connector get our "not built" refusal.
# The scheduler helper builds ModelConfig("facebook/opt-125m"): there is no hub
# access, so a config-only OPT-125m directory is written at that relative path.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
WORK="${1:-/tmp/upstream}"
shift || true
[[ "${1:-}" == "--" ]] && shift
VERSION=0.28.0
SRC="$WORK/vllm-$VERSION"
RUN="$WORK/run"

mkdir -p "$WORK"
if [[ ! -d "$SRC/tests" ]]; then
  # Upstream's setup.py would report "0.28.0+cpu" here; the override keeps pip's
  # version check happy. Only the sdist is fetched (no build, no deps).
  VLLM_VERSION_OVERRIDE=$VERSION "$PY" -m pip download "vllm==$VERSION" --no-deps \
    --no-binary vllm -d "$WORK" -q
  tar xzf "$WORK/vllm-$VERSION.tar.gz" -C "$WORK"
fi

rm -rf "$RUN"
mkdir -p "$RUN/tests/v1/core" "$RUN/tests/v1/kv_connector/unit"
touch "$RUN/tests/__init__.py" "$RUN/tests/v1/__init__.py" \
  "$RUN/tests/v1/kv_connector/__init__.py" "$RUN/tests/v1/kv_connector/unit/__init__.py"
TESTS=(test_kv_cache_utils.py test_prefix_caching.py test_scheduler.py
       test_async_scheduler.py test_single_type_kv_cache_manager.py)
for f in __init__.py utils.py "${TESTS[@]}"; do
  cp "$SRC/tests/v1/core/$f" "$RUN/tests/v1/core/"
done

cat > "$RUN/tests/conftest.py" <<'EOF'
import json
import logging
import os

import pytest

_OUTCOMES = {}


def pytest_runtest_logreport(report):
    # One line per test for triage: outcome and the crash message.
    if report.when == "call" or report.outcome != "passed":
        crash = getattr(report.longrepr, "reprcrash", None)
        msg = crash.message.splitlines()[0][:300] if crash else ""
        _OUTCOMES[report.nodeid] = (report.outcome, msg)


def pytest_sessionfinish(session):
    path = os.environ.get("UPSTREAM_OUTCOMES")
    if path:
        with open(path, "w") as f:
            json.dump(_OUTCOMES, f, indent=0, sort_keys=True)


@pytest.fixture()
def caplog_vllm(caplog):
    logger = logging.getLogger("vllm")
    old = logger.propagate
    logger.propagate = True
    yield caplog
    logger.propagate = old
EOF

cat > "$RUN/tests/v1/kv_connector/unit/utils.py" <<'EOF'
from dataclasses import dataclass


@dataclass
class MockKVConfig:
    matched_tokens: int = 0
    is_async: bool = False
    num_defers_before_matching: int = 0
EOF

# Config-only facebook/opt-125m (upstream's published shapes; no weights needed).
mkdir -p "$RUN/facebook/opt-125m"
cat > "$RUN/facebook/opt-125m/config.json" <<'EOF'
{"architectures": ["OPTForCausalLM"], "model_type": "opt", "hidden_size": 768,
 "ffn_dim": 3072, "num_attention_heads": 12, "num_hidden_layers": 12,
 "vocab_size": 50272, "max_position_embeddings": 2048, "word_embed_proj_dim": 768,
 "do_layer_norm_before": true, "bos_token_id": 2, "eos_token_id": 2,
 "pad_token_id": 1, "torch_dtype": "float16"}
EOF

cd "$RUN"
export UPSTREAM_OUTCOMES="$WORK/outcomes.json"
"$PY" -c "import vllm, sys; assert vllm.__file__.startswith('$REPO'), vllm.__file__"
set +e
"$PY" -m pytest -q -p no:cacheprovider -o addopts="" --tb=line -rN \
  "${@:-tests/v1/core}" 2>&1 | tee "$WORK/last_run.txt" | tail -n 5
exit "${PIPESTATUS[0]}"
