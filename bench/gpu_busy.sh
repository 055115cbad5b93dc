#!/usr/bin/env bash
# GPU-busy fraction on a GPU node without network: installs the carried wheels (.whl/) and dse
# into /tmp, then runs bench/gpu_busy.py (a process per trial, then warm trial workers, same
# space and seed) and copies its report and both studies' progress logs into OUT_DIR.
#   bash bench/gpu_busy.sh examples/llama_1b_h200.yaml OUT_DIR [gpu_busy.py args]
set -uo pipefail
SPACE=${1:?space file}; OUTDIR=${2:?output folder}; shift 2
mkdir -p "$OUTDIR"; OUTDIR=$(realpath "$OUTDIR")
source bench/gpu_env.sh || exit 1
REPO=$(pwd); SPACE=$(realpath "$SPACE")
WORK=/tmp/gpu_busy
cd /tmp  # not the checkout: its dse/ folder would shadow the installed dse.* namespace
nvidia-smi -L
python3 "$REPO/bench/gpu_busy.py" "$SPACE" --out "$WORK" "$@" 2>&1 | tee "$OUTDIR/progress.txt"
cp "$WORK/report.txt" "$WORK/report.json" "$OUTDIR/" 2>/dev/null
for m in process warm; do
  cp "$WORK/$m/progress.log" "$OUTDIR/$m-progress.log" 2>/dev/null
done
cat "$WORK"/warm/runs/*/workers/events.jsonl > "$OUTDIR/warm-events.jsonl" 2>/dev/null
# the studies' databases, trial logs and metrics, worker logs (for a closer look)
tar -czf "$OUTDIR/runs.tgz" -C "$WORK" --exclude='*.old' process warm 2>/dev/null
true
