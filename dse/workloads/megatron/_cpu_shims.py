"""Caller-side workarounds that let Megatron-Core 0.16.1 train on CPU with gloo.

No file of megatron-core is edited; everything here patches the *calling* process. Call
:func:`install` once, inside a trial process whose device is ``cpu``, before the model is
built (the trainer calls it before anything else of megatron is imported). It changes
process-wide state (``torch.cuda`` functions and a TorchFunctionMode that maps CUDA devices
to the CPU), so it must never run in the controller or in a shared pytest process;
importing this module changes nothing.

The workarounds:

1. Triton-only modules. In 0.16.1 ``megatron.core.inference.contexts.attention_context.
   triton.tensor_ops`` imports ``triton`` unconditionally; it is reached from
   ``megatron.core.ssm.mamba_mixer`` (hybrid/Mamba models). Without triton a stub module is
   registered under that exact name (a global ``triton`` stub would break torch._dynamo).
   The GPT training path of 0.16.1 does not reach it; the stub keeps hybrid builds importable.
2. RNG. :func:`seed_model_parallel` calls ``model_parallel_cuda_manual_seed(seed,
   inference_rng_tracker=True)``, which installs a tracker whose ``add``/``fork``/
   ``set_states`` are no-ops (the regular one calls ``torch.cuda.get_rng_state``); with
   ``use_cpu_initialization=True`` the weights come from the CPU generator. Activation
   recompute (``tensor_parallel.random.CheckpointFunction``) also saves and restores the
   CUDA generator state: ``_get_cuda_rng_state``/``_set_cuda_rng_state`` are replaced with
   CPU-safe versions.
3. ``torch.cuda.current_device`` (DDP buffers), ``current_stream`` (gradient sync),
   ``synchronize`` (pipeline p2p), plus ``Stream``/``stream``/``Event`` (overlap paths) get
   CPU stand-ins.
4. A :class:`torch.overrides.TorchFunctionMode` maps ``device="cuda"`` (and integer device
   indices) to the CPU, makes ``Tensor.cuda()`` return the tensor and reports
   ``Tensor.type()`` as ``torch.cuda.*`` (checks in the optimizer and grad clipping).
   Torch clears the mode stack while the autograd engine runs the ``backward`` of a Python
   ``autograd.Function``; Megatron's recompute (``CheckpointFunction``) re-runs the forward
   there (and builds a causal mask with ``device="cuda"``), so the mode is also entered
   around ``torch.autograd.function.BackwardCFunction.apply``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

__all__ = ["TRITON_STUB_MODULES", "install", "installed", "seed_model_parallel"]

#: Modules of megatron-core 0.16.1 that import triton unconditionally and can be reached
#: from a training build (see the module docstring).
TRITON_STUB_MODULES = ("megatron.core.inference.contexts.attention_context.triton.tensor_ops",)

_INSTALLED = False


def installed() -> bool:
    """True once :func:`install` has run in this process."""
    return _INSTALLED


def install() -> None:
    """Install the CPU workarounds in this process (idempotent)."""
    global _INSTALLED
    if _INSTALLED:
        return
    import torch

    if torch.cuda.is_available():
        raise RuntimeError("the CPU shims must not be installed where CUDA is available")
    _stub_triton_modules()
    _patch_torch_cuda(torch)
    _patch_megatron_rng()
    mode = _make_mode_class()()
    mode.__enter__()  # process-wide for the rest of the trial
    _wrap_python_backward(mode)
    _INSTALLED = True


def seed_model_parallel(seed: int) -> None:
    """Seed Megatron's RNG tracker on CPU (no CUDA generator states)."""
    import torch
    from megatron.core import tensor_parallel

    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed, inference_rng_tracker=True)


# --- 1. triton-only modules ---------------------------------------------------------------


def _megatron_core_dir() -> Path | None:
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "core"


def _stub_triton_modules() -> None:
    if importlib.util.find_spec("triton") is not None:
        return
    core = _megatron_core_dir()
    for name in TRITON_STUB_MODULES:
        if name in sys.modules:
            continue
        rel = Path(*name.split(".")[2:]).with_suffix(".py")
        if core is None or not (core / rel).exists():
            continue  # not in this megatron-core version: nothing to stub
        sys.modules[name] = _TritonStub(name)


class _TritonStub(types.ModuleType):
    """Stands in for a module that needs triton; its functions raise when called."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        module = self.__name__

        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(f"{module}.{attr} needs triton, which is not installed")

        return unavailable


# --- 2. RNG ------------------------------------------------------------------------------


def _patch_megatron_rng() -> None:
    import torch
    from megatron.core.tensor_parallel import random as mrandom

    def get_state(*args: Any, **kwargs: Any) -> torch.Tensor:
        return torch.empty(0, dtype=torch.uint8)

    def set_state(*args: Any, **kwargs: Any) -> None:
        return None

    mrandom._get_cuda_rng_state = get_state
    mrandom._set_cuda_rng_state = set_state


# --- 3. torch.cuda stand-ins -------------------------------------------------------------


class _CpuStream:
    """A do-nothing CUDA stream."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, other: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _CpuEvent:
        return event if event is not None else _CpuEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _CpuEvent:
    """A CUDA event that measures wall time."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._t: float | None = None

    def record(self, stream: Any = None) -> None:
        import time

        self._t = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _CpuEvent) -> float:
        if self._t is None or end._t is None:
            return 0.0
        return (end._t - self._t) * 1000.0


def _patch_torch_cuda(torch: Any) -> None:
    default_stream = _CpuStream()
    torch.cuda.current_device = lambda: 0
    torch.cuda.current_stream = lambda device=None: default_stream
    torch.cuda.default_stream = lambda device=None: default_stream
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.Stream = _CpuStream
    torch.cuda.Event = _CpuEvent
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()


# --- 4. device mapping -------------------------------------------------------------------


def _cpu_device(value: Any) -> Any:
    import torch

    if isinstance(value, torch.device):
        return torch.device("cpu") if value.type == "cuda" else value
    if isinstance(value, str) and value.startswith("cuda"):
        return "cpu"
    return value


def _make_mode_class() -> type:
    import torch
    from torch.overrides import TorchFunctionMode

    tensor_type = torch.Tensor.type
    tensor_cuda = torch.Tensor.cuda

    class CudaToCpuMode(TorchFunctionMode):
        """Runs CUDA-addressed torch calls on the CPU."""

        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> Any:
            kwargs = dict(kwargs or {})
            if func is tensor_cuda:
                return args[0]
            if func is tensor_type and len(args) == 1 and not kwargs:
                name = func(*args)
                return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
            if "device" in kwargs:
                dev = kwargs["device"]
                kwargs["device"] = "cpu" if isinstance(dev, int) else _cpu_device(dev)
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
            if args:
                args = tuple(_cpu_device(a) for a in args)
            return func(*args, **kwargs)

    return CudaToCpuMode


def _wrap_python_backward(mode: Any) -> None:
    """Run the backward of Python autograd Functions under ``mode`` too."""
    import torch
    from torch.autograd.function import BackwardCFunction

    def wrap(method: Any) -> Any:
        def run(self: Any, *args: Any) -> Any:
            if torch.overrides._get_current_function_mode_stack():
                return method(self, *args)
            with mode:
                return method(self, *args)

        return run

    BackwardCFunction.apply = wrap(BackwardCFunction.apply)  # type: ignore[method-assign]
    BackwardCFunction.apply_boxed = wrap(BackwardCFunction.apply_boxed)  # type: ignore[method-assign]
