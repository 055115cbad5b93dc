# Sourced after bench/gpu_env.sh on a GPU node without network: installs mamba-ssm and
# causal-conv1d from their carried source distributions (.whl/*.tar.gz) without compiling
# anything, and keeps Triton's compiled kernels in one cache per study and node.
#   source bench/gpu_env.sh && source bench/mamba_env.sh || exit 1
# Their setup.py files import torch (the node's) and would download a prebuilt wheel or
# compile CUDA code: *_SKIP_CUDA_BUILD packs only the Python sources (mamba-ssm's Triton SSD
# kernels need no build), *_FORCE_BUILD skips the download (which does not survive a name-
# resolution error); --no-deps because their requirements (triton, ninja, transformers, ...)
# are either on the image or unused by Megatron-Core's Mamba layers. setuptools, wheel,
# packaging and einops come as carried wheels (.whl/, installed by gpu_env.sh).
# `import mamba_ssm` still fails afterwards (no selective_scan_cuda); Megatron-Core and dse
# import mamba_ssm.ops.triton.* directly. causal_conv1d_cuda is absent: dse's trainer
# registers a labelled torch stand-in for it (trial metric mamba_kernels.conv1d).
DSE_GPU_ROOT=${DSE_GPU_ROOT:-/tmp}
if ! compgen -G ".whl/mamba_ssm-*.tar.gz" > /dev/null \
  || ! compgen -G ".whl/causal_conv1d-*.tar.gz" > /dev/null; then
  echo "mamba_env.sh: carry .whl/ with mamba_ssm-*.tar.gz and causal_conv1d-*.tar.gz" >&2
  return 1
fi
if [ ! -d "$DSE_GPU_ROOT/site/mamba_ssm" ]; then
  _t0=$(date +%s)
  # their setup.py imports wheel and packaging (carried wheels; gpu_env.sh installs .whl/*.whl
  # unless DSE_GPU_NO_WHEELS is set)
  if ! python3 -c "import wheel, packaging, setuptools" 2> /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --target "$DSE_GPU_ROOT/site" \
      .whl/wheel-*.whl .whl/packaging-*.whl .whl/setuptools-*.whl .whl/einops-*.whl || return 1
  fi
  MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE CAUSAL_CONV1D_SKIP_CUDA_BUILD=TRUE \
    CAUSAL_CONV1D_FORCE_BUILD=TRUE python3 -m pip install -q --no-deps --no-build-isolation \
    --no-index --no-cache-dir --target "$DSE_GPU_ROOT/site" \
    .whl/mamba_ssm-*.tar.gz .whl/causal_conv1d-*.tar.gz || return 1
  echo "mamba_env.sh: mamba-ssm and causal-conv1d installed in $(($(date +%s) - _t0)) s"
fi
# One Triton cache for the study on this node (compiled kernels and autotuning results):
# the first trial pays the compilation, later trial processes read it from disk.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$DSE_GPU_ROOT/dse_triton_cache}
export TRITON_CACHE_AUTOTUNING=${TRITON_CACHE_AUTOTUNING:-1}
mkdir -p "$TRITON_CACHE_DIR"
(cd "$DSE_GPU_ROOT" && python3 -) << 'EOF' || return 1  # not the checkout: its dse/ folder shadows dse.*
import os

from dse.workloads.megatron import _mamba_kernels as mk
from dse.workloads.megatron.features import has_feature

ok = has_feature("mamba_ssm")
print("mamba_env.sh: mamba_ssm Triton kernels:", ok, "| paths:", mk.kernel_path(True),
      mk.kernel_path(False))
# DSE_MAMBA_CPU_CHECK=1: a CPU check of the scripts (no Triton there: the trials run the
# labelled torch reference)
raise SystemExit(0 if ok or os.environ.get("DSE_MAMBA_CPU_CHECK") == "1" else 1)
EOF
