#!/usr/bin/env bash
# LoRA on one GPU (issue 38): the cost model's memory estimate against measured peaks for a
# LoRA space and for the same model trained in full, results packed into ONE archive
# OUT_DIR/lora_gpu.tgz (summary.txt beside it).
#   1. the GPU's name and memory (nvidia-smi) written into both spaces' resources;
#   2. bench/measure_table.py --warm over the LoRA space (examples/llama_1b_gpu_lora.yaml):
#      attention sdpa/unfused x MBS 1/2/4/8 x recompute none/full (16 rows);
#   3. the same model without semantics.peft (full training): sdpa x MBS 1/2/4/8, no
#      recompute (4 rows) -- what LoRA saves;
#   4. `dse estimate --table` on each table: every row's measured peak against the cost
#      model's estimate (estimates), before any fit and after a fit on the rows before it.
# Each part stops starting rows when the time budget (DSE_LORA_BUDGET_S, default 500 s) runs
# out; rows already measured are kept.
#   bash bench/lora_gpu.sh OUT_DIR            # on a GPU node, .whl/ carried
# CPU check of the script: DSE_GPU_NO_WHEELS=1 DSE_LORA_TINY=1 bash bench/lora_gpu.sh OUT_DIR
set -uo pipefail
OUTDIR=${1:?output folder}
mkdir -p "$OUTDIR"; OUTDIR=$(realpath "$OUTDIR")
REPO=$(pwd)
T0=$(date +%s)
BUDGET=${DSE_LORA_BUDGET_S:-500}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
source bench/gpu_env.sh || exit 1
echo "install: $(($(date +%s) - T0)) s"
W=$(mktemp -d "$DSE_GPU_ROOT/lora.XXXXXX")
cd "$DSE_GPU_ROOT"  # not the checkout: its dse/ folder would shadow the installed dse.*
GPU_NAME=""; GPU_GIB=""
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$W/gpu.txt"
  GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  GPU_GIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 \
    | awk '{printf "%.1f", $1 / 1024}')
fi
python3 - "$REPO/examples/llama_1b_gpu_lora.yaml" "$W" "$GPU_NAME" "$GPU_GIB" "${DSE_LORA_TINY:-0}" << 'PY'
import sys, yaml
src, w, name, gib, tiny = sys.argv[1:]
d = yaml.safe_load(open(src))
if name:
    d["resources"].update(gpu=name, gpu_memory_gib=float(gib))
if tiny == "1":  # a model small enough for a CPU check of this script
    d["model"].update(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                      ffn_hidden_size=128, vocab_size=256)
    d["semantics"].update(seq_length=64, steps=3, warmup_steps=1, precision="fp32")
    d["resources"].update(device="cpu", gpu=None, gpu_memory_gib=None)
yaml.safe_dump(d, open(f"{w}/lora.yaml", "w"), sort_keys=False)
d["semantics"].pop("peft")
d["study"] += "-full"
yaml.safe_dump(d, open(f"{w}/full.yaml", "w"), sort_keys=False)
PY
run_table() {  # SPACE OUT GRID...
  local space=$1 out=$2; shift 2
  echo "== table $(basename "$out") ($(left) s left)"
  python3 "$REPO/bench/measure_table.py" "$space" "$out" --warm --spare --timeout-s 240 \
    --stop-at $((T0 + BUDGET - 20)) "$@" 2>&1 | tee "${out%.jsonl}_progress.log" | tail -25
}
ATT="sdpa,unfused"; [ "${DSE_LORA_TINY:-0}" = 1 ] && ATT="unfused"
run_table "$W/lora.yaml" "$W/lora.jsonl" --grid attention_backend=$ATT \
  --grid micro_batch_size=8,4,2,1 --grid recompute=none,full
ATT1=${ATT%%,*}
run_table "$W/full.yaml" "$W/full.jsonl" --grid attention_backend=$ATT1 --grid micro_batch_size=8,4,2,1
for t in lora full; do
  [ -s "$W/$t.jsonl" ] || continue
  {
    echo "== $t: measured peak vs the cost model (estimates)"
    python3 -m dse.cli estimate --table "$W/$t.jsonl" 2>&1 | tail -40
    echo "== $t: calibrated on the rows before each"
    python3 -m dse.cli estimate --table "$W/$t.jsonl" --calibrate 2>&1 | tail -30
    python3 -m dse.cli estimate --table "$W/$t.jsonl" --json > "$W/${t}_estimate.json" 2>&1
  } | tee -a "$W/summary.txt"
done
echo "total $(($(date +%s) - T0)) s" | tee -a "$W/summary.txt"
cp "$W/summary.txt" "$OUTDIR/" 2> /dev/null
tar czf "$OUTDIR/lora_gpu.tgz" -C "$W" .
ls -la "$OUTDIR"
