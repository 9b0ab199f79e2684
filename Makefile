# Two commands do all the set-up on a fresh machine:
#   make demo   - creates .venv, installs kernelsmith, runs the main job on CPU (Triton interpreter)
#   make test   - creates .venv, installs kernelsmith and the serving stacks (SGLang in .venv-sglang), runs the
#                 test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-stacks test-sglang lint bench-host clean postgres-server

setup: $(VENV)/.installed

$(VENV)/.installed: setup.py pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned, so that nothing pulls another torch; its CPU build comes from PyTorch's CPU index
	# (PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make ...: README), plain PyPI has a CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q --no-compile -e '.[dev]'
	touch $@

demo: setup
	TRITON_INTERPRET=1 $(BIN)/python -m ks_inductor.demo

# The PostgreSQL cache tests start a throwaway server from Debian's binaries: installed here when missing, where
# root (or passwordless sudo) and apt-get allow it; elsewhere those tests skip (under CI=true they fail).
postgres-server:
	@command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	{ SUDO=; [ "$$(id -u)" = 0 ] || SUDO="sudo -n"; command -v apt-get >/dev/null 2>&1 && $$SUDO true 2>/dev/null && \
	  $$SUDO apt-get update -qq && $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } || \
	echo "note: PostgreSQL server binaries (initdb) are missing and cannot be installed here; the PostgreSQL tests will skip"

# The serving stacks' tests run against the real packages (docs/serving.md), each where it installs:
# - LMDeploy and vLLM in .venv: their wheels without dependencies (LMDeploy 0.18.0 pins torch<=2.12.1 and
#   triton<=3.7.1, vLLM 0.33.0 torch==2.14.0 and CUDA-only packages; the layer code the tests run works on .venv's
#   torch 2.13.0+cpu) and only the packages that code imports, pinned.
#   Importing vLLM patches Inductor's internals (vllm/env_override.py), so their tests run in a pytest process apart
#   from the rest of the suite. Importing them once after the install also writes yapf's grammar cache (imported
#   through LMDeploy's mmengine), which two test workers writing at once would read half written.
# - SGLang in .venv-sglang: its layer modules import torchvision, and PyPI's torchvision builds load only against
#   the torch build they were made for (CUDA); there it gets the torch it pins (2.14.1, a CUDA build that runs on a
#   CPU) and the packages its layer modules import. About 6 GB.
# Under CI=true a stack that does not import fails its tests instead of skipping them (tests/stacks.py).
LMDEPLOY := lmdeploy==0.18.0
VLLM := vllm==0.33.0
STACK_IMPORTS := psutil==7.2.2 pybase64==1.5.1 pyzmq==27.3.0 \
	mmengine-lite==0.10.7 yapf==0.43.0 platformdirs==4.14.8 addict==2.4.0 termcolor==3.3.0 \
	cbor2==6.3.0 aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1 \
	aiosignal==1.4.0 frozenlist==1.8.0 openai-harmony==0.0.8 cachetools==8.0.2 msgspec==0.22.0 cloudpickle==3.1.3 \
	uvloop==0.23.0 prometheus-client==0.26.0 xgrammar==0.2.8 apache-tvm-ffi==0.1.11 fastapi==0.136.3 \
	starlette==1.10.0 opentelemetry-api==1.45.2 partial-json-parser==0.2.1.1.post7 llguidance==1.7.6
STACK_TESTS := tests/test_integration_lmdeploy.py tests/test_integration_vllm.py
SGLANG_TESTS := tests/test_integration_sglang.py
SGLANG_VENV ?= .venv-sglang
SGLANG_IMPORTS := orjson psutil pybase64 starlette msgspec pyzmq IPython aiohttp dill sentencepiece requests tqdm \
	loguru gguf apache-tvm-ffi==0.1.11 transformers
PYTEST := TRITON_INTERPRET=1 $(BIN)/pytest -q -p no:cacheprovider
PYTEST_SGLANG := TRITON_INTERPRET=1 $(SGLANG_VENV)/bin/pytest -q -p no:cacheprovider $(SGLANG_TESTS)

# Every part runs, and the target fails if any part failed. The tests run with a home folder of their own, removed
# at the end: the serving stacks write caches there when imported (yapf's grammar, SGLang's kernels), which are no
# business of the user's home. LMDeploy is imported once first, so that its two test workers find yapf's grammar
# cache written whole.
test: setup $(VENV)/.stacks $(SGLANG_VENV)/.installed postgres-server
	@rc=0; home=$$(mktemp -d); export HOME=$$home XDG_CACHE_HOME=$$home/.cache; \
	echo "== the suite ($(VENV))"; \
	$(PYTEST) -n 2 --dist loadfile --durations=12 $(addprefix --ignore=,$(STACK_TESTS) $(SGLANG_TESTS)) || rc=1; \
	echo "== LMDeploy and vLLM ($(VENV), a process of their own)"; \
	$(BIN)/python -c "import lmdeploy.pytorch.nn.norm" || rc=1; \
	$(PYTEST) -n 2 --dist loadfile $(STACK_TESTS) || rc=1; \
	echo "== SGLang ($(SGLANG_VENV))"; \
	$(PYTEST_SGLANG) || rc=1; \
	rm -rf "$$home"; \
	exit $$rc

# The serving stacks' tests alone.
test-stacks: $(VENV)/.stacks $(SGLANG_VENV)/.installed
	$(PYTEST) -n 2 --dist loadfile $(STACK_TESTS)
	$(PYTEST_SGLANG)

test-sglang: $(SGLANG_VENV)/.installed
	$(PYTEST_SGLANG)

$(VENV)/.stacks: $(VENV)/.installed Makefile
	$(BIN)/pip install -q --no-deps --no-compile $(LMDEPLOY) $(VLLM) $(STACK_IMPORTS)
	@# The stacks import (a check of the install) with a home folder of their own: yapf writes its grammar cache there.
	home=$$(mktemp -d); HOME=$$home XDG_CACHE_HOME=$$home/.cache $(BIN)/python -c "import lmdeploy.pytorch.nn.norm, \
	lmdeploy.pytorch.nn.activation, vllm.model_executor.layers.layernorm, vllm.model_executor.layers.activation"; \
	rc=$$?; rm -rf "$$home"; exit $$rc
	touch $@

$(SGLANG_VENV)/.installed: setup.py pyproject.toml
	$(PY) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/pip install -q --no-compile torch==2.14.1 torchvision==0.29.1
	$(SGLANG_VENV)/bin/pip install -q --no-compile -e . pytest pytest-timeout
	$(SGLANG_VENV)/bin/pip install -q --no-compile --no-deps sglang==0.5.23 compressed-tensors==0.18.0
	$(SGLANG_VENV)/bin/pip install -q --no-compile $(SGLANG_IMPORTS)
	touch $@

lint: setup
	$(BIN)/ruff check .

bench-host: setup
	TRITON_INTERPRET=1 $(BIN)/pytest benchmarks/host -o python_files='bench_*.py' --benchmark-enable -p no:cacheprovider

clean:
	rm -rf $(VENV) $(SGLANG_VENV) build *.egg-info
