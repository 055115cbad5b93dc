#!/usr/bin/env bash
# On a GPU node without network: installs the carried wheels (.whl/) and dse into /tmp, then
# compares the llama_1b example's built-in workload with the same trainer through the
# megatron_lm launcher (bench/launcher_vs_builtin.py). Writes report.txt, report.json and the
# tail of one launcher trial's log into OUT_DIR.
#   bash bench/launcher_gpu.sh OUT_DIR [launcher_vs_builtin.py args]
set -uo pipefail
OUTDIR=${1:?output folder}; shift
mkdir -p "$OUTDIR"; OUTDIR=$(realpath "$OUTDIR")
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
PYTHONPATH=/tmp/site python3 -m pip install -q --no-index --no-deps --no-build-isolation \
  --no-cache-dir --target /tmp/dse . || exit 1  # the carried setuptools (>=77) builds dse
export PYTHONPATH=/tmp/dse:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
REPO=$(pwd)
WORK=/tmp/launcher_vs_builtin
cd /tmp  # not the checkout: its dse/ folder would shadow the installed dse.* namespace
nvidia-smi -L
python3 "$REPO/bench/launcher_vs_builtin.py" "$REPO/examples/llama_1b_h200.yaml" \
  "$REPO/examples/llama_1b_h200_megatron_lm.yaml" --out "$WORK" "$@" 2>&1 | tee "$OUTDIR/report.txt"
cp "$WORK/report.json" "$WORK/bench.db" "$OUTDIR/" 2>/dev/null
f=$(find "$WORK/runs" -path '*megatron-lm*' -name log.txt | sort | head -1)
[ -n "$f" ] && { echo "== $f"; grep -v '^\s*$' "$f" | tail -12; } > "$OUTDIR/launcher_trial_log_tail.txt"
tail -3 "$WORK"/*.log > "$OUTDIR/study_logs_tail.txt" 2>/dev/null
true
