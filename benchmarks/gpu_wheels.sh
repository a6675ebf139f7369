#!/usr/bin/env bash
# Fetch, on this (networked) machine, the wheels that the lent H200 lacks for
# benchmarks/gpu_check.sh: its image has torch (CUDA), triton, transformers,
# safetensors, numpy, psutil, xxhash, jinja2, ... but not these. They land in
# .whl/ (git-ignored via .git/info/exclude), which the device call carries:
#   bash benchmarks/gpu_wheels.sh
#   device run: carry [".whl"], command "bash benchmarks/gpu_check.sh python3"
# FlashInfer is left out: its wheel alone (62 MB) nearly fills the 64 MiB the
# device call may carry, so its GPU tests skip there.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PY=${PY:-.venv/bin/python}
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64; do
  PLATFORMS+=(--platform "$p")
done
# Python 3.12 there; one version of each, pydantic-core pinned by pydantic.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLATFORMS[@]}" -d .whl \
  msgspec pyzmq cbor2 gguf "pydantic==2.14.4" "pydantic-core==2.50.5" \
  annotated-types typing-inspection
ls -la .whl
