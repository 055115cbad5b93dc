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
#   all    both (only if the node is fast enough: the budget cuts the table short, rows kept);
#   table+study  the table first, then the study in what is left of the budget (the table's
#          rows tune and compile the Triton kernels, kept on disk, that the study reads).
# DSE_HYBRID_MEASUREMENT=adaptive:MIN:MAX gives the study (and table) a measurement section:
# warm-up ends where the step times settle, then at least MIN steps, until the step time is
# known to 1% (at most MAX). The archive also holds `dse status --format json` (the GPU time
# by part) and the warm workers' events (why a worker was replaced).
# Each part stops starting work when its time budget (DSE_HYBRID_BUDGET_S, default 520 s from
# the start) runs out; a warm node keeps the Triton cache of an earlier call. A table cut
# short goes on from its first row not run with DSE_HYBRID_TABLE_SKIP=N (rows in file order).
#   bash bench/hybrid_gpu.sh study OUT_DIR     # on a GPU node, .whl/ carried (wheels + sdists)
#   bash bench/hybrid_gpu.sh table OUT_DIR
set -uo pipefail
PART=${1:?part: study, table or all}; OUTDIR=${2:?output folder}; shift 2
case "$PART" in study | table | all | table+study) ;; *) echo "unknown part $PART" >&2; exit 2 ;; esac
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
if [ "${DSE_HYBRID_TINY:-0}" = 1 ]; then
  # a CPU check of this script (with DSE_GPU_NO_WHEELS=1 DSE_MAMBA_CPU_CHECK=1): the proxy's
  # layer pattern and routing on a model small enough for a CPU (the torch reference SSD)
  python3 - "$SPACE" "$W/tiny.yaml" << 'EOF'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
d["model"].update(num_layers=4, hybrid_layer_pattern="M*EM", hidden_size=64,
                  num_attention_heads=4, num_query_groups=2, kv_channels=16, ffn_hidden_size=128,
                  vocab_size=256, num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
                  moe_shared_expert_intermediate_size=64, mamba_num_heads=4, mamba_head_dim=16,
                  mamba_state_dim=16, mamba_num_groups=2, mamba_chunk_size=32)
d["semantics"].update(seq_length=128, steps=3, warmup_steps=1)
d["resources"].update(device="cpu", gpu=None, gpu_memory_gib=None)
d["fixed"]["attention_backend"] = "unfused"
d["budget"].update(n_trials=3, remeasure=0)
d["knobs"]["use_mamba_mem_eff_path"]["baseline"] = False
yaml.safe_dump(d, open(sys.argv[2], "w"))
EOF
  SPACE="$W/tiny.yaml"
fi
if [ -n "${DSE_HYBRID_MEASUREMENT:-}" ]; then
  # the study with another measurement section (issue 36), e.g. adaptive:10:30 = warm-up
  # ends where the step times settle, then at least 10 steps and until the step time is
  # known to 1% (at most 30)
  python3 - "$SPACE" "$W/space.yaml" "$DSE_HYBRID_MEASUREMENT" << 'EOF'
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
mode, lo, hi = sys.argv[3].split(":")
d["measurement"] = {"mode": mode, "min_steps": int(lo), "max_steps": int(hi),
                    "rel_halfwidth": 0.01}
yaml.safe_dump(d, open(sys.argv[2], "w"))
EOF
  SPACE="$W/space.yaml"
fi
SUMMARY_ARGS=(--space "$SPACE")
rc=0
run_table() {
  echo "== table ($(left) s left)"
  python3 "$REPO/bench/measure_table.py" "$SPACE" "$W/table.jsonl" --warm --spare --timeout-s 240 \
    --stop-at $((T0 + BUDGET - ${DSE_HYBRID_STUDY_RESERVE_S:-45})) --skip "${DSE_HYBRID_TABLE_SKIP:-0}" \
    ${DSE_HYBRID_TABLE_LIMIT:+--limit "$DSE_HYBRID_TABLE_LIMIT"} \
    ${DSE_HYBRID_WORKER_SLACK_MIB:+--memory-slack-mib "$DSE_HYBRID_WORKER_SLACK_MIB"} \
    --grid micro_batch_size=2,4,8,16 --grid recompute=none,selective --grid recompute_modules=moe \
    --grid use_mamba_mem_eff_path=true,false --grid moe_token_dispatcher_type=allgather,alltoall \
    2>&1 | tee "$W/table_progress.log"
  [ -f "$W/table.jsonl" ] && SUMMARY_ARGS+=(--table "$W/table.jsonl")
}
# table+study: the table first (its rows tune and compile the kernels the study then reads)
if [ "$PART" = table+study ]; then run_table; fi
if [ "$PART" != table ] && [ "$(left)" -gt 90 ]; then
  DB="sqlite:///$W/study.db"
  echo "== study ($(left) s left)"
  timeout "$(($(left) - 30))" python3 -m dse.cli start --space "$SPACE" --storage "$DB" \
    --workdir "$W/runs" "$@" 2>&1 | tee "$W/study_progress.log"
  rc=${PIPESTATUS[0]}
  python3 -m dse.cli status --storage "$DB" > "$W/status.txt" 2>&1
  python3 -m dse.cli status --storage "$DB" --format json > "$W/status.json" 2>&1
  SUMMARY_ARGS+=(--status "$W/status.json")
  # the warm workers' events (start, memory after each trial, why one was replaced)
  cat "$W"/runs/*/workers/events.jsonl > "$W/worker-events.jsonl" 2> /dev/null || true
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
if [ "$PART" = table ] || [ "$PART" = all ]; then run_table; fi
du -sh "$TRITON_CACHE_DIR" 2> /dev/null | sed 's/^/triton cache after: /' | tee -a "$W/triton_cache.txt"
python3 "$REPO/bench/hybrid_summary.py" "${SUMMARY_ARGS[@]}" -o "$W/summary.json" \
  > "$W/summary.txt" 2>&1
cat "$W/summary.txt" | head -80
echo "total $(($(date +%s) - T0)) s" | tee -a "$W/summary.txt"
cp "$W/summary.json" "$W/summary.txt" "$OUTDIR/" 2> /dev/null
tar czf "$OUTDIR/hybrid_${PART//+/_}.tgz" -C "$W" .
ls -la "$OUTDIR"
exit "$rc"
