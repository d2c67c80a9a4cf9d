#!/usr/bin/env bash
# The load test of README's "Serving": the same greedy chat requests (HumanEval problems and
# Spec-Bench questions in turn, $MAX_TOKENS new tokens, streamed) at 1/4/8/16 concurrent clients
# against, on the same machine and the same GGUFs:
#   specdec serve with its default drafter (the n-gram index),
#   the same with --max-delay-share inf (drafts chosen for the batch's tokens per second alone),
#   specdec serve with the model's default draft model (both models' forwards batched),
#   specdec serve without drafting (plain decoding, batched),
#   a second, identical server without drafting (specdec-plain-twin: two servers doing the same work
#   in the same run, whose spread is the machine's noise floor for every ratio of the run),
#   llama.cpp's llama-server (`make llama-peers`, a stock build) plain and with --model-draft, at
#   --parallel equal to our --slots,
#   and, when `make peers` / `make vllm` installed them, llama-cpp-python's server and vLLM on CPU.
# Every server is started first (one at a time, each ready before the next loads) and kept up; then
# each level is measured on every server in turn, the order reversed from one level to the next,
# so that a machine that drifts faster or slower over the run (shared hosts do, by 10-30% within
# minutes here) shifts every server's figures of a level alike rather than one server's. Each
# server's answers at every level are compared with its own answers at the first.
# With PASSES=n, each level of PASS_CLIENTS (default: every level) is measured n times in a row, the
# servers' order reversed from one pass to the next (A B C, C B A, ...), and the passes are merged
# into one line per server and level (scripts/loadtest.py --merge: tokens/s over all their tokens
# and seconds, latency percentiles over all their requests); every pass's own line is kept in
# $OUT's "-passes.jsonl" sibling. Where servers do the same work, one pass compares the machine's
# drift between their turns as much as the servers (10-30% within minutes on shared hosts).
# With WAVES=w, the servers take turns at a finer grain: each pass of a level is measured in parts of
# w x clients requests (requests 0..w*c-1 on every server, then the next w*c, ...; at 1 client with
# WAVES=1, a request at a time), the servers' order rotated by one from one part to the next
# (A B C, B C A, C A B, ...), so a slow minute of the machine falls on every server's turn alike,
# not on one server's whole level; the parts merge as passes do (one line per part in "-passes.jsonl").
# Output: one JSON line per server and level in $OUT; a level where any request failed has no
# figures (they would compare servers on different requests), only how many failed and why. With
# TICKS=DIR, each specdec server also writes every tick of its batch to DIR/<server>.jsonl
# (SPECDEC_TICK_TRACE; python scripts/loadtest.py --tick-traces DIR/*.jsonl sums them up).
# `scripts/loadtest_servers.sh index` runs the workload of the index of earlier outputs instead:
# $CLIENTS clients of one team (one API key, tenants kept apart as by default) ask about the same
# files in turn: the first $DISTINCT humaneval-files questions (explain, test, review the functions
# of a file), $REQUESTS requests going through them in rounds, greedy, $MAX_TOKENS new tokens,
# streamed. Against, on the same machine one after the other: the same server with the index off
# (--index-tokens 0: each request drafts from its own prompt and answer only), and with the index on
# but the requests sent without a key (each request its own tenant, so nothing is shared).
# Its output: one JSON line per server in $OUT (default bench-results/loadtest-index/results.jsonl).
set -euo pipefail
cd "$(dirname "$0")/.."

index_workload() {
  MODEL=${MODEL:-qwen2.5-coder-1.5b}
  OUT=${OUT:-bench-results/loadtest-index/results.jsonl}
  CLIENTS=${CLIENTS:-4}
  DISTINCT=${DISTINCT:-8}
  REQUESTS=${REQUESTS:-24}
  MAX_TOKENS=${MAX_TOKENS:-256}
  SLOTS=${SLOTS:-4}
  PY=.venv/bin/python
  mkdir -p "$(dirname "$OUT")"; : > "$OUT"; rm -f "$(dirname "$OUT")"/texts-*.json

  run() {  # port label key server-flags...
    local port=$1 label=$2 key=$3 rc=0; shift 3
    .venv/bin/specdec serve --model "$MODEL" --backend llamacpp --slots "$SLOTS" --port "$port" "$@" \
        > "/tmp/loadtest-$label.log" 2>&1 & local pid=$!
    # The load test waits (--ready-timeout) until the server answers a real request.
    $PY scripts/loadtest.py --url "http://127.0.0.1:$port" --clients "$CLIENTS" --requests "$REQUESTS" \
        --max-tokens "$MAX_TOKENS" --questions humaneval-files --distinct "$DISTINCT" --time-limit 3600 \
        --ready-timeout 600 --label "$label" ${key:+--api-key "$key"} --texts "$(dirname "$OUT")/texts-$label.json" \
        | tee -a "$OUT" || rc=$?
    kill "$pid"; wait "$pid" 2>/dev/null || true; sleep 2
    return "$rc"  # the comparison below needs every server's answers
  }

  run 8110 per-request team --index-tokens 0
  run 8111 team-index team
  case ",${SERVERS:-per-request,team-index,no-key}," in *,no-key,*) run 8112 no-key "";; esac
  $PY - "$(dirname "$OUT")" <<'PY' | tee -a "$OUT"
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
base = json.loads((d / "texts-per-request.json").read_text())
for label in ("team-index", "no-key"):
    if not (d / f"texts-{label}.json").exists():
        continue
    other = json.loads((d / f"texts-{label}.json").read_text())
    print(json.dumps({"server": label, "answers_differing_from_per_request": sum(base.get(i) != t for i, t in other.items()),
                      "compared": len(other)}))
PY
}
if [ "${1:-}" = index ]; then index_workload; exit 0; fi

MODEL=${MODEL:-qwen2.5-coder-1.5b}
Q=${Q:-humaneval,spec-bench}
OUT=${OUT:-bench-results/loadtest-qwen/results.jsonl}
CLIENTS=${CLIENTS:-1,4,8,16}
REQUESTS=${REQUESTS:-32}
MAX_TOKENS=${MAX_TOKENS:-128}
SLOTS=${SLOTS:-16}
SERVERS=${SERVERS:-specdec,specdec-pair,specdec-plain,llama-server-plain,llama-server-draft}
PASSES=${PASSES:-1}
WAVES=${WAVES:-}
PASS_CLIENTS=${PASS_CLIENTS:-$CLIENTS}
PY=.venv/bin/python
LLAMA_BIN=${SPECDEC_LLAMA_CPP_BIN:-.peers/llama.cpp/build/bin}
mkdir -p "$(dirname "$OUT")"; : > "$OUT"
RAW=$OUT  # where the levels' lines go as they are measured (every pass's, when there are several)
if [ "$PASSES" -gt 1 ] || [ -n "$WAVES" ]; then RAW=${OUT%.jsonl}-passes.jsonl; : > "$RAW"; fi
# Where and when, first: the date, the commit (with "+dirty" if src/ or scripts/ had changes), the CPU
# and the settings, as a line of its own (the tables read only the levels' lines).
COMMIT="$(git rev-parse --short=12 HEAD)$(git diff --quiet HEAD -- src scripts || echo +dirty)"
$PY -c "import json, sys, datetime; from specdec.cpu import machine_tag
print(json.dumps({'run': 'scripts/loadtest_servers.sh', 'date': datetime.datetime.now().isoformat(timespec='seconds'),
                  'commit': sys.argv[1], 'cpu': machine_tag(), 'model': sys.argv[2], 'questions': sys.argv[3],
                  'requests': int(sys.argv[4]), 'max_tokens': int(sys.argv[5]), 'slots': int(sys.argv[6]),
                  'servers': sys.argv[7], 'passes': int(sys.argv[8]), 'pass_clients': sys.argv[9],
                  **({'waves': int(sys.argv[10])} if sys.argv[10] else {})}))" \
    "$COMMIT" "$MODEL" "$Q" "$REQUESTS" "$MAX_TOKENS" "$SLOTS" "$SERVERS" "$PASSES" "$PASS_CLIENTS" "$WAVES" >> "$RAW"
GGUF=$($PY -c "from specdec.models import resolve; print(resolve('$MODEL', need_hf=False).gguf)")
DRAFT=$($PY -c "from specdec.models import default_draft_model; print(default_draft_model('$MODEL') or '')")
DRAFT_GGUF=""
[ -n "$DRAFT" ] && DRAFT_GGUF=$($PY -c "from specdec.models import resolve; print(resolve('$DRAFT', need_hf=False).gguf)")

# The load test itself waits (--ready-timeout) until the server answers a real request: llama-server
# lists its model on /v1/models while it still loads it, and answers 503 to the rest until done.
RUNDIR=$(mktemp -d); PORTS=(); LABELS=(); PIDS=()
cleanup() { for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$RUNDIR"; }
trap cleanup EXIT
run() {  # port label command...: start the server and wait until it answers (its levels run later)
  local port=$1 label=$2; shift 2
  case ",$SERVERS," in *",$label,"*) ;; *) return 0;; esac
  local trace=""
  [ -n "${TICKS:-}" ] && mkdir -p "$TICKS" && trace="$TICKS/$label.jsonl" && : > "$trace"
  SPECDEC_TICK_TRACE="$trace" "$@" > "/tmp/loadtest-$label.log" 2>&1 & PIDS+=($!)
  PORTS+=("$port"); LABELS+=("$label")
  $PY -c "import sys; sys.path.insert(0, 'scripts'); from loadtest import wait_ready, NotReady
try: wait_ready(sys.argv[1], timeout=600)
except NotReady as exc: print(f'{sys.argv[2]}: {exc}', file=sys.stderr)" "http://127.0.0.1:$port" "$label"
}
measure() {  # every level on every server started, in turns (see the top of this file)
  local level i j pass passes size first turn=0 order=() n=${#LABELS[@]}
  for ((i = 0; i < n; i++)); do order+=("$i"); done
  for level in ${CLIENTS//,/ }; do
    passes=1; case ",$PASS_CLIENTS," in *",$level,"*) passes=$PASSES;; esac
    size=$REQUESTS; [ -n "$WAVES" ] && size=$((WAVES * level < REQUESTS ? WAVES * level : REQUESTS))
    for ((pass = 1; pass <= passes; pass++)); do
      for ((first = 0; first < REQUESTS; first += size)); do
        for ((j = 0; j < n; j++)); do
          if [ -n "$WAVES" ]; then i=$(((j + turn) % n)); else i=${order[$j]}; fi
          $PY scripts/loadtest.py --url "http://127.0.0.1:${PORTS[$i]}" --clients "$level" --first "$first" \
              --requests "$((REQUESTS - first < size ? REQUESTS - first : size))" --max-tokens "$MAX_TOKENS" \
              --questions "$Q" --time-limit 3600 --ready-timeout 600 --label "${LABELS[$i]}" \
              --reference "$RUNDIR/${LABELS[$i]}.json" | tee -a "$RAW" \
            || echo "${LABELS[$i]}: no load test at $level clients (see above; the server's log: /tmp/loadtest-${LABELS[$i]}.log)" >&2
        done
        turn=$((turn + 1))
      done
      local reversed=(); for ((i = ${#order[@]} - 1; i >= 0; i--)); do reversed+=("${order[$i]}"); done
      order=("${reversed[@]}")
    done
  done
  if [ "$RAW" != "$OUT" ]; then $PY scripts/loadtest.py --merge "$RAW" > "$OUT"; fi
}

# Every server gets the same context per slot (2048 cells: the longest prompt plus the answer).
CTX=$((SLOTS * 2048))
run 8100 specdec .venv/bin/specdec serve --model "$MODEL" --backend llamacpp --slots "$SLOTS" --port 8100
run 8107 specdec-throughput .venv/bin/specdec serve --model "$MODEL" --backend llamacpp --slots "$SLOTS" --port 8107 \
    --max-delay-share inf
run 8101 specdec-pair .venv/bin/specdec serve --model "$MODEL" --backend llamacpp --drafter model --slots "$SLOTS" --port 8101
run 8102 specdec-plain .venv/bin/specdec serve --model "$MODEL" --backend llamacpp --drafter none --slots "$SLOTS" --port 8102
run 8108 specdec-plain-twin .venv/bin/specdec serve --model "$MODEL" --backend llamacpp --drafter none --slots "$SLOTS" \
    --port 8108
run 8103 llama-server-plain "$LLAMA_BIN/llama-server" --model "$GGUF" --host 127.0.0.1 --port 8103 -c "$CTX" \
    -t "$(nproc)" --parallel "$SLOTS"
if [ -n "$DRAFT_GGUF" ]; then
  run 8104 llama-server-draft "$LLAMA_BIN/llama-server" --model "$GGUF" --model-draft "$DRAFT_GGUF" \
      --spec-type draft-simple --host 127.0.0.1 --port 8104 -c "$CTX" -t "$(nproc)" --parallel "$SLOTS"
fi
run 8105 llama-cpp-python $PY -m llama_cpp.server --model "$GGUF" --port 8105 --n_ctx 4096 --n_threads "$(nproc)" \
    --interrupt_requests False
if [ -x .venv-vllm/bin/python ]; then
  HF=$($PY -c "from specdec.models import resolve; print(resolve('$MODEL').hf_dir)")
  VLLM_CPU_KVCACHE_SPACE=4 run 8106 vllm-cpu .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server \
      --model "$HF" --served-model-name "$MODEL" --dtype float32 --enforce-eager --port 8106
fi
measure
