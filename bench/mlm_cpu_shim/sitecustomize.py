"""CPU rehearsal of upstream Megatron-LM's pretrain_gpt.py (bench/upstream_mlm.py --cpu).

Never on a GPU node. Megatron-LM's training loop asserts CUDA and calls torch.cuda across
``megatron/training``; Megatron-Core itself runs on CPU with dse's caller-side shims
(:mod:`dse.workloads.megatron._cpu_shims`). This file is put on PYTHONPATH by the rehearsal
only and acts only in a torchrun worker (LOCAL_RANK set) with DSE_MLM_CPU_SHIM=1, so the
controller and the trial process are untouched. What it changes, in that worker only:

* dse's Megatron-Core CPU shims (CUDA devices mapped to the CPU, CPU streams and events,
  RNG tracker states);
* ``torch.cuda.is_available`` True (``initialize_megatron`` asserts it), one device,
  ``set_device``/``empty_cache``/RNG calls as no-ops, memory statistics 0 (the log's memory
  line then reads 0 MB);
* megatron-core's batch-invariant kernels (``transformer.custom_layers.
  batch_invariant_kernels``, imported by ``megatron/training/initialize.py`` and needing
  triton, which a CPU torch lacks) registered as a stub module where triton is absent: its
  functions raise if called (only ``--batch-invariant-mode`` calls them);
* megatron-core's dataset-helper build (``datasets.utils.compile_helpers``, a ``make`` in
  the installed package, which a wheel ships without its Makefile) skipped when the compiled
  helpers (``helpers_cpp``) already import;
* the CPU generator's state saved and restored around Megatron-LM's jit warm-up
  (``initialize._warmup_jit_function``): on a GPU its ``torch.rand(..., device="cuda")``
  draws come from the CUDA generator, and the weights from the model-parallel RNG tracker,
  so the weights never depend on them; on the CPU both are the CPU generator, and the
  warm-up's draws (of shape ``[seq_length, micro_batch_size, ...]``) made the initial
  weights depend on the micro-batch size;
* Megatron-LM's fused-kernel loader (``megatron.legacy.fused_kernels.load``, which runs
  ``nvcc -V``) skipped: on the GPU node upstream's own loader runs.

torch.compile is off in the rehearsal (TORCHDYNAMO_DISABLE=1, set by the bench), so
Megatron's jit fusions run eagerly. No file of Megatron-LM or megatron-core is edited.
"""

import os

if os.environ.get("DSE_MLM_CPU_SHIM") == "1" and "LOCAL_RANK" in os.environ:
    import torch

    from dse.workloads.megatron import _cpu_shims

    _cpu_shims.install()
    _cuda = torch.cuda
    _cuda.is_available = lambda: True
    _cuda.device_count = lambda: 1
    _cuda.set_device = lambda *a, **k: None
    _cuda.empty_cache = lambda: None
    for _name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                  "max_memory_reserved"):  # fmt: skip
        setattr(_cuda, _name, lambda *a, **k: 0)
    _cuda.reset_peak_memory_stats = lambda *a, **k: None
    _cuda.memory_stats = lambda *a, **k: {}
    _cuda.get_rng_state = lambda *a, **k: torch.empty(0, dtype=torch.uint8)
    _cuda.set_rng_state = lambda *a, **k: None
    _cuda.manual_seed = lambda *a, **k: None
    _cuda.manual_seed_all = lambda *a, **k: None

    import importlib.util

    if importlib.util.find_spec("triton") is None:
        import sys

        _name = "megatron.core.transformer.custom_layers.batch_invariant_kernels"
        sys.modules.setdefault(_name, _cpu_shims._TritonStub(_name))

    try:
        import megatron.core.datasets.helpers_cpp  # noqa: F401
    except ImportError:
        pass
    else:
        import megatron.core.datasets.utils as _dataset_utils

        _dataset_utils.compile_helpers = lambda: None

    import megatron.legacy.fused_kernels as _fused_kernels

    _fused_kernels.load = lambda args: None

    import megatron.training.initialize as _initialize

    _warmup = _initialize._warmup_jit_function

    def _warmup_keeping_the_cpu_generator() -> None:
        state = torch.get_rng_state()
        try:
            _warmup()
        finally:
            torch.set_rng_state(state)

    _initialize._warmup_jit_function = _warmup_keeping_the_cpu_generator
