# Sourced by the GPU benches on a node without network: installs the carried wheels (.whl/)
# and dse itself into /tmp and exports PYTHONPATH (run from the checkout's root).
#   source bench/gpu_env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || return 1
PYTHONPATH=/tmp/site python3 -m pip install -q --no-index --no-deps --no-build-isolation \
  --no-cache-dir --target /tmp/dse . || return 1  # the carried setuptools (>=77) builds dse
export PYTHONPATH=/tmp/dse:/tmp/site PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
