#!/usr/bin/env bash
# Issue 37: the recipe dse runs for CloudAI MegatronBridge tests, and the cost model's memory
# and speed estimates of that recipe's own layout (estimates, not measurements; no GPU).
# Usage (from the repository root): bash bench/cloudai_recipe_estimates.sh [WORKDIR]
set -euo pipefail
work="${1:-$(mktemp -d)}"
mkdir -p "$work"
t=tests/fixtures/cloudai_current/test
qwen="$t/megatron_bridge_qwen_30b.toml"
sed -e 's/gpu_type = "h100"/gpu_type = "b200"/; s/num_gpus = 16/num_gpus = 8/' \
    -e 's/compute_dtype = "fp8_cs"/compute_dtype = "fp8_mx"/' "$qwen" > "$work/qwen_b200.toml"
sed -e 's/gpu_type = "h100"/gpu_type = "gb300"/; s/num_gpus = 16/num_gpus = 8/' \
    -e 's/compute_dtype = "fp8_cs"/compute_dtype = "fp8_mx"/' "$qwen" > "$work/qwen_gb300.toml"
for f in "$qwen" "$t/megatron_bridge_nemotron_nano_pytorch_profiler.toml" \
         "$work/qwen_b200.toml" "$work/qwen_gb300.toml"; do
    n=$(basename "$f" .toml)
    python -m dse.cli cloudai import "$f" -o "$work/$n.yaml" 2>/dev/null
    echo "== $n: $(grep -o 'recipe: [a-z0-9_]*_config' "$work/$n.yaml" | tail -1)"
    python -m dse.cli start --space "$work/$n.yaml" --workload sim --n-trials 1 \
        --storage "sqlite:///$work/$n.db" --workdir "$work/runs_$n" 2>&1 \
        | grep -E '^trial 0 (complete|infeasible)' | cut -d'|' -f1
done
