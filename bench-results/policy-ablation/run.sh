#!/bin/sh
# usage: sh run.sh TREE METHODS OUT
# Replays the four recorded workloads through the n-gram drafter and the adaptive policy of the
# checkout TREE (its src/ on the path), held-out prompts skipped, each forward priced by the cost
# curve measured for Qwen2.5-Coder-1.5B (llama.cpp, exact kernels). METHODS e.g.
# "plain,ngram,ngram:calibration_prior=0" (a setting after ':' overrides a number of the policy's Tuning).
TREE=$1; METHODS=$2; OUT=$3
R=$(cd "$(dirname "$0")/.." && pwd)
COSTS=$HOME/.cache/specdec/costs/qwen2.5-coder-1.5b-llamacpp-gguf-exact-rows-gen2-AMD_EPYC-avx512-2t.json
HE=HumanEval/16,HumanEval/18,HumanEval/20,HumanEval/22,HumanEval/24,HumanEval/26,HumanEval/28,HumanEval/30
TT=86,88,96,98,106,108,116,118,126,128,136,138,146,148,156,158
cd "$TREE"
: > "$OUT"
for f in "$R/replay-ceilings/humaneval-edit.json $HE" "$R/replay-repair/transcripts.json $HE" \
         "$R/replay-ceilings/spec-bench-2turn.json $TT" "$R/replay-ceilings/spec-bench.json -"; do
  set -- $f
  skip=$2; [ "$skip" = "-" ] && skip=""
  echo "## $(basename "$1")" >> "$OUT"
  PYTHONPATH="$TREE/src" python scripts/replay_transcripts.py replay "$1" --costs "$COSTS" --skip "$skip" \
    --methods "$METHODS" >> "$OUT" 2>&1
done
