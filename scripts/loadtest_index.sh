#!/usr/bin/env bash
# The server workload of the index of earlier outputs: $CLIENTS clients of one team (one API key,
# tenants kept apart as by default) ask about the same files in turn: the first $DISTINCT
# humaneval-files questions (explain, test, review the functions of a file), $REQUESTS requests
# going through them in rounds, greedy, $MAX_TOKENS new tokens, streamed. Against, on the same
# machine one after the other: the same server with the index off (--index-tokens 0: each
# request drafts from its own prompt and answer only), and with the index on but the requests
# sent without a key (each request its own tenant, so nothing is shared).
# Output: one JSON line per server in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
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
