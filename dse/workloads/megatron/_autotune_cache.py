"""Triton autotune choices kept on disk across trial processes, for every autotuned kernel.

Triton 3.x keeps an autotuner's choice on disk, in ``TRITON_CACHE_DIR``, when asked
(``TRITON_CACHE_AUTOTUNING=1``, read when the kernel is decorated, or
``triton.autotune(cache_results=True)``): a later process with the same kernel, key and
configurations reads the choice instead of timing every configuration again. Triton gives up
on that for a kernel whose configurations carry a ``pre_hook`` ("We can't serialize prehooks,
so just give up and run the benchmarks", ``Autotuner.check_disk_cache``). mamba-ssm's SSD
backward kernels zero their gradient outputs through such pre-hooks (``init_to_zero``), so
every fresh trial process timed them again: the bulk of a hybrid trial's 10-68 s first step
in a new worker with a warm Triton cache.

:func:`install` wraps ``Autotuner.check_disk_cache``: for configurations with pre-hooks it
stores the *position* of the chosen configuration among the configurations Triton timed (and
their timings) in Triton's own cache, under a key made as Triton makes its own (Triton's
version, the backend, the kernel's source key, the cache-invalidating environment, the tuning
key, each configuration) plus the pre-hooks' names; a later process takes the configuration
at that position from its own list, pre-hook included. Everything else stays Triton's. It also
sets ``TRITON_CACHE_AUTOTUNING=1`` where the environment does not say otherwise, so kernels
decorated after it (mamba-ssm imports them lazily) ask for the disk cache.

The choice is keyed by the tuning key Triton builds (the kernel's ``key`` arguments and the
tensors' dtypes): a shape tuned once on a node is not timed again by any trial of the study
there. :func:`counters` counts the hits and the timings done in this process.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["install", "counters", "describe_config", "dump_choice", "load_choice", "CHOICE_FORMAT"]

#: Version tag of the stored choice (part of its key: a new format never reads an old one).
CHOICE_FORMAT = "dse-autotune-prehook-v1"
_MARK = "__dse_autotune_cache__"
_COUNTS = {"disk_hits": 0, "benchmarked": 0}


def counters() -> dict[str, int]:
    """Autotuning of kernels with pre-hooks in this process: choices read from disk
    (``disk_hits``) and timed here (``benchmarked``)."""
    return dict(_COUNTS)


def describe_config(cfg: Any) -> str:
    """A configuration as the key sees it: Triton's own text of it (kwargs, warps, stages,
    ...) and the qualified name of its pre-hook (a different hook is another configuration)."""
    hook = getattr(cfg, "pre_hook", None)
    name = "" if hook is None else getattr(hook, "__qualname__", type(hook).__name__)
    return f"{cfg}, pre_hook: {name}"


def dump_choice(tuning_key: Sequence[Any], configs: Sequence[Any], best: Any,
                timings: dict[Any, Any]) -> str:  # fmt: skip
    """The stored text of one choice: the position of ``best`` among ``configs`` (by identity,
    else equality), each configuration's description and timings."""
    idx = next((i for i, c in enumerate(configs) if c is best), None)
    if idx is None:
        idx = next(i for i, c in enumerate(configs) if c == best)
    return json.dumps(
        {
            "format": CHOICE_FORMAT,
            "key": [str(k) for k in tuning_key],
            "best": idx,
            "configs": [describe_config(c) for c in configs],
            "timings": [_timing(timings.get(c)) for c in configs],
        }
    )


def _timing(t: Any) -> Any:
    if t is None:
        return None
    if isinstance(t, int | float):
        return float(t)
    try:
        return [float(x) for x in t]
    except TypeError:
        return None


def load_choice(text: str | None, configs: Sequence[Any]) -> tuple[int, list[Any]] | None:
    """(position of the chosen configuration, timings) from stored text, or None when there
    is none or it does not describe these ``configs`` (another list, order or pre-hook)."""
    if not text:
        return None
    try:
        d = json.loads(text)
    except ValueError:
        return None
    if not isinstance(d, dict) or d.get("format") != CHOICE_FORMAT:
        return None
    if d.get("configs") != [describe_config(c) for c in configs]:
        return None
    best = d.get("best")
    if not isinstance(best, int) or isinstance(best, bool) or not 0 <= best < len(configs):
        return None
    timings = d.get("timings")
    if not isinstance(timings, list) or len(timings) != len(configs):
        timings = [None] * len(configs)
    return best, timings


def _cache_key(tuner: Any, tuning_key: Sequence[Any], configs: Sequence[Any]) -> tuple[Any, str]:
    """(Triton's cache manager for this choice, the file name): the key Triton builds for its
    own stored choices, with each configuration's pre-hook and this format added."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import get_cache_manager, triton_key
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction

    fn = tuner.fn
    while not isinstance(fn, JITFunction):
        fn = fn.fn
    parts = [
        triton_key(),
        make_backend(driver.active.get_current_target()).hash(),
        fn.cache_key,
        str(sorted(get_cache_invalidating_env_vars().items())),
        str(tuning_key),
        *(describe_config(c) for c in configs),
        CHOICE_FORMAT,
    ]
    key = hashlib.sha256("-".join(parts).encode("utf-8")).hexdigest()
    return get_cache_manager(key), f"{fn.__name__[:150]}.dse_autotune.json"


def install() -> bool:
    """Wrap Triton's ``Autotuner.check_disk_cache`` (once per process) and ask for the disk
    cache of autotune choices; False where Triton is absent or its autotuner is not the one
    this was written for (Triton 3.x: ``check_disk_cache(self, tuning_key, configs,
    bench_fn)``)."""
    try:
        from triton.runtime import autotuner
    except ImportError:
        return False
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")
    cls = autotuner.Autotuner
    orig = getattr(cls, "check_disk_cache", None)
    if orig is None:
        return False
    if getattr(orig, _MARK, False):
        return True
    import inspect

    if list(inspect.signature(orig).parameters)[:4] != [
        "self",
        "tuning_key",
        "configs",
        "bench_fn",
    ]:
        return False

    def check_disk_cache(self: Any, tuning_key: Any, configs: Any, bench_fn: Any) -> bool:
        if not tuning_key or not any(getattr(c, "pre_hook", None) for c in configs):
            return bool(orig(self, tuning_key, configs, bench_fn))
        try:
            cache, name = _cache_key(self, tuning_key, configs)
            path = cache.get_file(name)
            text = None
            if path:
                with open(path) as f:
                    text = f.read()
        except Exception:  # noqa: BLE001 - Triton's own path then (it times them)
            return bool(orig(self, tuning_key, configs, bench_fn))
        got = load_choice(text, configs)
        if got is not None:
            best, timings = got
            self.cache[tuning_key] = configs[best]
            self.configs_timings = dict(zip(configs, timings, strict=True))
            _COUNTS["disk_hits"] += 1
            return True
        bench_fn()
        _COUNTS["benchmarked"] += 1
        try:
            text = dump_choice(tuning_key, configs, self.cache[tuning_key], self.configs_timings)
            cache.put(text, name, binary=False)
        except Exception:  # noqa: BLE001 - not stored: the next process times it again
            pass
        return False

    setattr(check_disk_cache, _MARK, True)
    cls.check_disk_cache = check_disk_cache
    return True
