#!/usr/bin/env bash
# On a GPU node without network: upstream Megatron-LM's pretrain_gpt.py (core_v0.16.1, from
# .mlm/, extracted here by bench/mlm_extract.sh) as dse trials through the megatron_lm
# launcher with the resolved-configuration check on, and the same configurations through
# the built-in trainer (bench/upstream_mlm.py). Carry .whl and .mlm. Writes ONE archive,
# $OUT/upstream_mlm.tgz (report.txt, report.json, bench.db, every trial's log and metrics).
#   bash bench/upstream_mlm_gpu.sh [upstream_mlm.py args, e.g. --only upstream]
# Each call runs one round (of --only's workload, or both) and adds it to /tmp/upstream_mlm,
# so the repeat is a second call on the same warm node; FRESH=1 starts over.
# Default grid: micro_batch_size 1,2 x recompute none,full x cross_entropy_loss_fusion
# false,true (8 configurations per workload and round).
set -uo pipefail
OUT=${OUT:?set OUT to the folder that comes back}
[ -f .mlm/pretrain_gpt.py ] || { echo ".mlm/pretrain_gpt.py missing: run bench/mlm_extract.sh and carry .mlm"; exit 2; }
source bench/gpu_env.sh || exit 1
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
SITE=${DSE_GPU_ROOT:-/tmp}/site
# The megatron-core wheel ships its compiled dataset helpers (helpers_cpp) but no Makefile;
# Megatron-LM's initialize runs `make -C megatron/core/datasets` on rank 0: a Makefile that
# only checks the prebuilt library is there.
D=$SITE/megatron/core/datasets
ls "$D"/helpers_cpp*.so >/dev/null || { echo "no prebuilt helpers_cpp in $D"; exit 1; }
printf 'default:\n\t@ls helpers_cpp*.so >/dev/null && echo "dataset helpers: prebuilt helpers_cpp from the megatron-core wheel"\n' > "$D/Makefile"
# Megatron-LM's fused-kernel loader runs $CUDA_HOME/bin/nvcc -V
if [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null; then
  CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")"); export CUDA_HOME
fi
REPO=$(pwd)
W=/tmp/upstream_mlm  # kept while the node stays warm: a second call adds the next round
[ -n "${FRESH:-}" ] && rm -rf "$W"
mkdir -p "$W"
{
  nvidia-smi -L
  python3 -c "import torch, sys; from torch.utils import cpp_extension as c; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'CUDA_HOME', c.CUDA_HOME)"
  python3 -c "import megatron.core, triton, regex, einops; print('megatron.core', megatron.core.__version__, 'triton', triton.__version__)"
  cat .mlm/SOURCE.txt
} 2>&1 | tee -a "$W/env.txt"
cd /tmp  # not the checkout: its dse/ folder would shadow the installed dse.* namespace
timeout 560 python3 "$REPO/bench/upstream_mlm.py" \
  --space "$REPO/examples/llama_1b_h200_megatron_lm_upstream.yaml" --mlm "$REPO/.mlm" \
  --set micro_batch_size=1,2 --set recompute=none,full \
  --set cross_entropy_loss_fusion=false,true --out "$W" "$@" 2>&1 | tee "$W/driver.txt"
rc=${PIPESTATUS[0]}
echo "driver exit $rc" >> "$W/driver.txt"
tar czf "$OUT/upstream_mlm.tgz" -C /tmp upstream_mlm
exit "$rc"
