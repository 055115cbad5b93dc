#!/usr/bin/env bash
# Runs a whole study on a GPU node without network: installs the carried wheels (.whl/) and
# dse itself into /tmp, runs `dse start` on the given space, then writes status and best.
#   bash bench/gpu_study.sh examples/llama_1b_h200.yaml OUT_DIR [extra dse start args]
set -uo pipefail
SPACE=${1:?space file}; OUTDIR=${2:?output folder}; shift 2
mkdir -p "$OUTDIR"
source bench/gpu_env.sh || exit 1
SPACE=$(realpath "$SPACE")
cd /tmp  # not the checkout: its dse/ folder would shadow the installed dse.* namespace
nvidia-smi -L
DB="sqlite:///$OUTDIR/study.db"
python3 -m dse.cli start --space "$SPACE" --storage "$DB" --workdir /tmp/dse_runs "$@" \
  2>&1 | tee "$OUTDIR/progress.log"
python3 -m dse.cli status --storage "$DB" > "$OUTDIR/status.txt"
python3 -m dse.cli status --storage "$DB" --format json > "$OUTDIR/status.json"
python3 -m dse.cli best --storage "$DB" --format json | tee "$OUTDIR/best.json"
cat "$OUTDIR/status.txt"
# the log of the last failed trial, if any, for diagnosis
for f in /tmp/dse_runs/*/trial-*/log.txt; do
  grep -q '"failure"' "$(dirname "$f")/metrics.jsonl" 2>/dev/null && tail -5 "$f"
done | tail -40
