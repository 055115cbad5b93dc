# Sourced by the GPU benches on a node without network: installs the carried wheels (.whl/)
# and dse itself under $DSE_GPU_ROOT (default /tmp) and exports PYTHONPATH (run from the
# checkout's root). --upgrade on both: a second run on the same node installs this checkout,
# not the code left there by the first.
#   source bench/gpu_env.sh || exit 1
DSE_GPU_ROOT=${DSE_GPU_ROOT:-/tmp}
# a script that sourced it already (bench/gpu_headline.sh) installed this checkout: once
if [ -n "${DSE_GPU_ENV_DONE:-}" ]; then return 0; fi
# DSE_GPU_NO_WHEELS=1: the interpreter has them (a CPU check of a GPU bench)
if [ -z "${DSE_GPU_NO_WHEELS:-}" ] && compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$DSE_GPU_ROOT/site" .whl/*.whl || return 1
fi
PYTHONPATH="$DSE_GPU_ROOT/site" python3 -m pip install -q --no-index --no-deps \
  --no-build-isolation --no-cache-dir --upgrade --target "$DSE_GPU_ROOT/dse" . \
  || return 1  # the carried setuptools (>=77) builds dse
export PYTHONPATH="$DSE_GPU_ROOT/dse:$DSE_GPU_ROOT/site" PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 DSE_GPU_ENV_DONE=1
