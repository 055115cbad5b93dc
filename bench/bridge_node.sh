#!/bin/bash
# Megatron-Bridge 0.6.2 on one GPU node: which of its imports run (the exact blocker), and the
# resolved-configuration check on 8 configurations of Bridge's bare GPT recipe where they
# do (bench/bridge_node.py). Needs .whl/ (gpu_env.sh) and .whl/bridge/megatron_bridge-0.6.2-
# py3-none-any.whl; .mlm/ (bench/mlm_extract.sh) puts Megatron-LM's megatron/training on the
# path as the upstream bench does. One archive: $OUT/bridge_node.tar.gz. About 2 minutes.
#   bash bench/bridge_node.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
source bench/gpu_env.sh || exit 1
WHEEL=$(ls .whl/bridge/megatron_bridge-*.whl 2>/dev/null | head -1)
[ -n "$WHEEL" ] || { echo "no .whl/bridge/megatron_bridge-*.whl"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$DSE_GPU_ROOT/bridge" "$WHEEL" || exit 1
EXTRA="$DSE_GPU_ROOT/bridge"
[ -d .mlm ] && EXTRA="$EXTRA:$(pwd)/.mlm"
mkdir -p "$OUT/bridge_node"
PYTHONPATH="$PYTHONPATH:$EXTRA" timeout 540 python3 bench/bridge_node.py --out "$OUT/bridge_node" \
  2>&1 | tee "$OUT/bridge_node/console.log"
tar -C "$OUT" -czf "$OUT/bridge_node.tar.gz" bridge_node && rm -rf "$OUT/bridge_node"
