#!/usr/bin/env bash
# Extracts what upstream Megatron-LM's pretrain_gpt.py needs besides megatron-core (the
# megatron-core wheel provides megatron.core, with its compiled dataset helpers) from a local
# Megatron-LM git checkout (a bare mirror works too) at a pinned commit, into .mlm/ (ignored;
# it travels with a GPU run as a carried path):
#   pretrain_gpt.py gpt_builders.py model_provider.py megatron/{training,legacy,post_training,rl}
# megatron/legacy (fused_kernels, model), post_training and rl are imported by
# megatron/training and model_provider at import time.
#   bash bench/mlm_extract.sh PATH/TO/Megatron-LM [COMMIT]   (default core_v0.16.1)
set -euo pipefail
SRC=${1:?path of a Megatron-LM git checkout}
REF=${2:-55ac7082517c3878ae653c07c09c534b8aed49f6}  # tag core_v0.16.1
DEST=${MLM_DIR:-.mlm}
git --git-dir="$(git -C "$SRC" rev-parse --absolute-git-dir)" cat-file -e "$REF^{commit}"
rm -rf "$DEST" && mkdir -p "$DEST"
git -C "$SRC" archive "$REF" pretrain_gpt.py gpt_builders.py model_provider.py \
  megatron/training megatron/legacy megatron/post_training megatron/rl | tar -x -C "$DEST"
echo "Megatron-LM $REF (extracted by bench/mlm_extract.sh)" > "$DEST/SOURCE.txt"
du -sh "$DEST"
