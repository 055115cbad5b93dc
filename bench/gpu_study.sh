#!/usr/bin/env bash
# Runs a whole study on a GPU node without network: installs the carried wheels (.whl/) and
# dse itself under $DSE_GPU_ROOT (default /tmp), runs `dse start` on the given space, then
# writes status and best, and the log tails of this run's failed trials. Exits with
# `dse start`'s status.
#   bash bench/gpu_study.sh examples/llama_1b_h200.yaml OUT_DIR [extra dse start args]
set -uo pipefail
SPACE=${1:?space file}; OUTDIR=${2:?output folder}; shift 2
mkdir -p "$OUTDIR"; OUTDIR=$(realpath "$OUTDIR")
source bench/gpu_env.sh || exit 1
SPACE=$(realpath "$SPACE")
# this run's trials only (an earlier run's, or another study's, stay out of the scan below)
mkdir -p "$DSE_GPU_ROOT/dse_runs"
WORKDIR=$(mktemp -d "$DSE_GPU_ROOT/dse_runs/run.XXXXXX")
cd "$DSE_GPU_ROOT"  # not the checkout: its dse/ folder would shadow the installed dse.*
if command -v nvidia-smi > /dev/null; then nvidia-smi -L; fi
DB="sqlite:///$OUTDIR/study.db"
python3 -m dse.cli start --space "$SPACE" --storage "$DB" --workdir "$WORKDIR" "$@" \
  2>&1 | tee "$OUTDIR/progress.log"
rc=${PIPESTATUS[0]}
python3 -m dse.cli status --storage "$DB" > "$OUTDIR/status.txt"
python3 -m dse.cli status --storage "$DB" --format json > "$OUTDIR/status.json"
python3 -m dse.cli best --storage "$DB" --format json | tee "$OUTDIR/best.json"
cat "$OUTDIR/status.txt"
# the warm workers' events (memory after each trial, recycles), if any
cat "$WORKDIR"/*/workers/events.jsonl > "$OUTDIR/worker-events.jsonl" 2> /dev/null || true
# the logs of this run's failed trials, if any, for diagnosis
for f in "$WORKDIR"/*/trial-*/log.txt; do
  if grep -q '"failure"' "$(dirname "$f")/metrics.jsonl" 2> /dev/null; then
    echo "== $f"
    tail -5 "$f"
  fi
done | tail -40
exit "$rc"
