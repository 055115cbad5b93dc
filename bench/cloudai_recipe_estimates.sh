#!/usr/bin/env bash
# Issue 37: every CloudAI MegatronBridge / NeMoRun test dse has (upstream files under
# tests/fixtures/cloudai_current/test): the recipe dse runs for it, that recipe's layout, and
# the cost model's memory and speed estimates of it (estimates, not measurements; no GPU).
# Usage (from the repository root): bash bench/cloudai_recipe_estimates.sh [WORKDIR]
set -euo pipefail
work="${1:-$(mktemp -d)}"
mkdir -p "$work"
for f in tests/fixtures/cloudai_current/test/*.toml; do
    n=$(basename "$f" .toml)
    if ! python -m dse.cli cloudai import "$f" -o "$work/$n.yaml" 2>"$work/$n.err"; then
        echo "== $n: import refused: $(tail -1 "$work/$n.err")"
        continue
    fi
    echo "== $n: $(grep -o 'recipe: [a-zA-Z0-9_]*' "$work/$n.yaml" | tail -1)"
    grep -o "the recipe's own layout and settings: .*" "$work/$n.yaml" || true
    python -m dse.cli estimate --space "$work/$n.yaml" --json | python -c '
import json, sys
d = json.load(sys.stdin)
m, t, tr = d["memory"], d["throughput"], d["trust"]
print("estimate: %.2f GiB of %s usable (fits=%s), %.1f TFLOP/s/GPU, trust %s: %s" % (
    m["total_gib"], d["usable_gib"], d["fits"], t["tflops_per_gpu"], tr["label"], tr["why"]))'
    python -m dse.cli start --space "$work/$n.yaml" --workload sim --n-trials 1 \
        --storage "sqlite:///$work/$n.db" --workdir "$work/runs_$n" 2>&1 \
        | grep -E '^trial 0 (complete|infeasible|failed|invalid)' | cut -d'|' -f1
done
