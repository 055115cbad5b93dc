#!/usr/bin/env bash
# The hybrid Mamba-MoE proxy on one H200 (issue 27), results packed into ONE archive
# OUT_DIR/hybrid_<part>.tgz (summary.json + summary.txt beside it):
#   study  installs mamba-ssm (bench/mamba_env.sh), runs `dse start` on
#          examples/nemotron_h_proxy_h200.yaml (12 trials + 1 re-measure, warm workers, one
#          Triton cache for the study), exports it and summarises it (bench/hybrid_summary.py:
#          best, peak memory vs the cost model's estimate, losses vs the baseline's, first-step
#          and build seconds, the Mamba kernels used);
#   table  the same install, then bench/measure_table.py --warm over MBS 2/4/8/16 x recompute
#          none/selective(moe) x use_mamba_mem_eff_path x dispatcher allgather/alltoall
#          (32 rows; OOM rows where one H200 runs out), the cost model's accuracy on it before
#          and after a fit on the even rows, checked on the odd rows;
#   all    both (only if the node is fast enough: the budget cuts the table short, rows kept).
# Each part stops starting work when its time budget (DSE_HYBRID_BUDGET_S, default 520 s from
# the start) runs out; a warm node keeps the Triton cache of an earlier call. A table cut
# short goes on from its first row not run with DSE_HYBRID_TABLE_SKIP=N (rows in file order).
#   bash bench/hybrid_gpu.sh study OUT_DIR     # on a GPU node, .whl/ carried (wheels + sdists)
#   bash bench/hybrid_gpu.sh table OUT_DIR
set -uo pipefail
PART=${1:?part: study, table or all}; OUTDIR=${2:?output folder}; shift 2
case "$PART" in study | table | all) ;; *) echo "unknown part $PART" >&2; exit 2 ;; esac
mkdir -p "$OUTDIR"; OUTDIR=$(realpath "$OUTDIR")
REPO=$(pwd)
T0=$(date +%s)
BUDGET=${DSE_HYBRID_BUDGET_S:-520}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
SPACE=${DSE_HYBRID_SPACE:-$REPO/examples/nemotron_h_proxy_h200.yaml}
source bench/gpu_env.sh || exit 1
t_install=$(date +%s)
source bench/mamba_env.sh || exit 1
echo "install (wheels + mamba): $(($(date +%s) - T0)) s; mamba part $(($(date +%s) - t_install)) s"
W=$(mktemp -d "$DSE_GPU_ROOT/hybrid.XXXXXX")
cd "$DSE_GPU_ROOT"  # not the checkout: its dse/ folder would shadow the installed dse.*
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.used --format=csv
du -sh "$TRITON_CACHE_DIR" 2> /dev/null | sed 's/^/triton cache before: /' | tee "$W/triton_cache.txt"
SUMMARY_ARGS=(--space "$SPACE")
rc=0
if [ "$PART" != table ]; then
  DB="sqlite:///$W/study.db"
  echo "== study ($(left) s left)"
  timeout "$(($(left) - 30))" python3 -m dse.cli start --space "$SPACE" --storage "$DB" \
    --workdir "$W/runs" "$@" 2>&1 | tee "$W/study_progress.log"
  rc=${PIPESTATUS[0]}
  python3 -m dse.cli status --storage "$DB" > "$W/status.txt" 2>&1
  python3 -m dse.cli best --storage "$DB" --format json > "$W/best.json" 2>&1
  study=$(python3 -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['study'])" "$SPACE")
  python3 -m dse.cli export --study "$study" --storage "$DB" -o "$W/study.json" 2>&1 | tail -2
  SUMMARY_ARGS+=(--export "$W/study.json")
  # the trials' metrics files and the last lines of their logs (not the whole logs)
  for f in "$W"/runs/*/trial-*/metrics.jsonl; do
    [ -f "$f" ] || continue
    d=$(dirname "$f"); n=$(basename "$d")
    mkdir -p "$W/trials/$n"; cp "$f" "$W/trials/$n/"
    tail -30 "$d/log.txt" > "$W/trials/$n/log_tail.txt" 2> /dev/null
  done
  rm -rf "$W/runs"
fi
if [ "$PART" != study ]; then
  echo "== table ($(left) s left)"
  python3 "$REPO/bench/measure_table.py" "$SPACE" "$W/table.jsonl" --warm --timeout-s 240 \
    --stop-at $((T0 + BUDGET - 45)) --skip "${DSE_HYBRID_TABLE_SKIP:-0}" \
    --grid micro_batch_size=2,4,8,16 --grid recompute=none,selective --grid recompute_modules=moe \
    --grid use_mamba_mem_eff_path=true,false --grid moe_token_dispatcher_type=allgather,alltoall \
    2>&1 | tee "$W/table_progress.log"
  [ -f "$W/table.jsonl" ] && SUMMARY_ARGS+=(--table "$W/table.jsonl")
fi
du -sh "$TRITON_CACHE_DIR" 2> /dev/null | sed 's/^/triton cache after: /' | tee -a "$W/triton_cache.txt"
python3 "$REPO/bench/hybrid_summary.py" "${SUMMARY_ARGS[@]}" -o "$W/summary.json" \
  > "$W/summary.txt" 2>&1
cat "$W/summary.txt" | head -80
echo "total $(($(date +%s) - T0)) s" | tee -a "$W/summary.txt"
cp "$W/summary.json" "$W/summary.txt" "$OUTDIR/" 2> /dev/null
tar czf "$OUTDIR/hybrid_$PART.tgz" -C "$W" .
ls -la "$OUTDIR"
exit "$rc"
