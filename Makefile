# Two commands do all the set-up on a fresh machine:
#   make demo   - creates .venv, installs kernelsmith, runs the main job on CPU (Triton interpreter)
#   make test   - creates .venv, installs kernelsmith, runs the test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-sglang lint bench-host clean postgres-server

setup: $(VENV)/.installed

$(VENV)/.installed: setup.py pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned, so that nothing pulls a CUDA build of torch onto a CPU machine
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

test: setup postgres-server
	TRITON_INTERPRET=1 $(BIN)/pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=12

# SGLang's layer modules import torchvision, and PyPI's torchvision builds load only against the torch build they
# were made for (CUDA): SGLang gets its own virtual environment with the torch it pins (2.14.1, a CUDA build that
# runs on a CPU) and only the packages its layer modules import. Several GB, so `make test` does not make it; the
# SGLang tests skip there (docs/serving.md).
SGLANG_VENV ?= .venv-sglang
SGLANG_IMPORTS := orjson psutil pybase64 starlette msgspec pyzmq IPython aiohttp dill sentencepiece requests tqdm \
	loguru gguf apache-tvm-ffi==0.1.11 transformers

test-sglang: $(SGLANG_VENV)/.installed
	TRITON_INTERPRET=1 $(SGLANG_VENV)/bin/pytest -q -p no:cacheprovider tests/test_integration_sglang.py

$(SGLANG_VENV)/.installed: setup.py pyproject.toml
	$(PY) -m venv $(SGLANG_VENV)
	$(SGLANG_VENV)/bin/pip install -q --upgrade pip
	$(SGLANG_VENV)/bin/pip install -q torch==2.14.1 torchvision==0.29.1
	$(SGLANG_VENV)/bin/pip install -q --no-compile -e . pytest pytest-timeout
	$(SGLANG_VENV)/bin/pip install -q --no-deps sglang==0.5.23 compressed-tensors==0.18.0
	$(SGLANG_VENV)/bin/pip install -q $(SGLANG_IMPORTS)
	touch $@

lint: setup
	$(BIN)/ruff check .

bench-host: setup
	TRITON_INTERPRET=1 $(BIN)/pytest benchmarks/host -o python_files='bench_*.py' --benchmark-enable -p no:cacheprovider

clean:
	rm -rf $(VENV) $(SGLANG_VENV) build *.egg-info
