"""Reading a training recipe's own log: per-iteration figures, memory reports, failures.

Three formats, each a set of named, compiled regexes at module level:

* ``megatron``: Megatron-LM's ``training_log`` line (``iteration N/ M | ... | elapsed time
  per iteration (ms): ... | throughput per GPU (TFLOP/s/GPU): ... | lm loss: ... |``) and
  ``report_memory`` (``[Rank r] (after N iterations) memory (MB) | allocated: ... | max
  allocated: ... | reserved: ... | max reserved: ...``, MiB).
* ``bridge``: Megatron-Bridge prints the same iteration line, a ``Step Time : 7.04s GPU
  utilization: 24.7MODEL_TFLOP/s/GPU`` line before it, and its memory report in GB (1e9
  bytes) as ``mem-max-allocated-gigabytes: ...``.
* ``nemo``: NeMo 2.0's progress line (``Training epoch E, iteration i/n | ... |
  reduced_train_loss: ... | train_step_timing in s: ... | TFLOPS_per_GPU: ... |
  peak_memory_usage: <bytes> |``), 0-based iterations.

Lines of several ranks may be interleaved and prefixed (``0: ``, ``[rank3]:``); an
iteration logged by several ranks counts once. Failures are classified by
:data:`LOG_PATTERNS` (the one list of log failure patterns, also used by the runners).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dse.core.records import FailureClass
from dse.model.flops import tflops_per_gpu

__all__ = [
    "LOG_FORMATS",
    "LOG_PATTERNS",
    "TFLOPS_LOG_FIELD",
    "LogStep",
    "ParsedLog",
    "LogParser",
    "classify_failure",
    "classify_log",
    "detect_format",
    "parse_log",
]

LOG_FORMATS = ("megatron", "bridge", "nemo")

#: Where each format prints its own TFLOP/s (the origin of ``tflops_per_gpu_log``).
TFLOPS_LOG_FIELD = {
    "megatron": "Megatron-LM iteration line 'throughput per GPU (TFLOP/s/GPU)' (--log-throughput)",
    "bridge": "Megatron-Bridge 'Step Time : ...s GPU utilization: ...MODEL_TFLOP/s/GPU' line",
    "nemo": "NeMo FLOPsMeasurementCallback 'TFLOPS_per_GPU'",
}

_GIB = float(2**30)

# --- iteration lines ----------------------------------------------------------------------

#: Megatron-LM / Bridge ``training_log``: `` iteration      71/     100 | key: value | ...``
MEGATRON_ITERATION = re.compile(r"\biteration\s+(?P<it>\d+)/\s*(?P<total>\d+)\s*\|(?P<rest>.*)$")
#: The last line of the argument table upstream Megatron-LM's training loop prints at start
#: (``---- end of arguments ----``): the log is upstream's own (dse's built-in trainer prints
#: Megatron-LM's iteration lines but no table).
MEGATRON_ARGS_END = re.compile(r"-{8,} end of arguments -{8,}\s*$")
#: NeMo 2.0 progress line: ``Training epoch 0, iteration 120/149 | key: value | ...``
NEMO_ITERATION = re.compile(
    r"Training epoch (?P<epoch>\d+), iteration (?P<it>\d+)/(?P<total>\d+)\s*\|(?P<rest>.*)$"
)
#: NeMo's Lightning progress bar (tqdm): ``Epoch 0: ... | 795/77225 [..., k=v, k=v]``.
NEMO_PROGRESS_BAR = re.compile(
    r"Epoch (?P<epoch>\d+):[^|]*\|[^|]*\|\s*(?P<it>\d+)/(?P<total>\d+)\s*\[(?P<rest>[^\]]*)\]"
)
#: ``key=value`` fields of the progress bar, separated by ``,``.
BAR_FIELD = re.compile(r"(?:^|,)\s*(?P<key>[^=,]+?)=(?P<value>[^,]*)")
#: ``key: value`` fields of an iteration line, separated by ``|``.
FIELD = re.compile(r"\s*(?P<key>[^|:]+?):\s*(?P<value>[^|]*?)\s*(?:\||$)")
#: Bridge's throughput line printed before its iteration line (``MODEL_TFLOP/s/GPU``; Bridge
#: 0.2 printed ``TFLOP/s/GPU``).
BRIDGE_STEP_TIME = re.compile(
    r"Step Time\s*:\s*(?P<s>[0-9.]+)s GPU utilization:\s*(?P<tf>[0-9.]+)\s*(?:MODEL_)?TFLOP/s/GPU"
)
#: NeMo's memory fields (bytes): ``max_memory_allocated`` (tensors) and
#: ``max_memory_reserved`` (the caching allocator), NeMo's MegatronStrategy with
#: ``NEMO_LOG_MEMORY_USAGE=1``; NeMo 1's ``peak_memory_usage`` is the reserved peak.
NEMO_MEMORY_FIELDS = ("max_memory_allocated", "max_memory_reserved", "peak_memory_usage")

# --- memory reports -----------------------------------------------------------------------

#: Megatron-LM ``report_memory`` (MiB).
MEGATRON_MEMORY = re.compile(
    r"\(after (?P<it>\d+) iterations\) memory \(MB\)"
    r".*?\|\s*max allocated:\s*(?P<alloc>[0-9.]+)"
    r"(?:.*?\|\s*max reserved:\s*(?P<reserved>[0-9.]+))?"
)
#: Megatron-Bridge ``report_memory`` (GB = 1e9 bytes).
BRIDGE_MEMORY = re.compile(
    r"\(after (?P<it>\d+) iterations\) memory \(GB\)"
    r".*?\|\s*mem-max-allocated-gigabytes:\s*(?P<alloc>[0-9.]+)"
    r"(?:.*?\|\s*mem-max-reserved-gigabytes:\s*(?P<reserved>[0-9.]+))?"
)

# --- failures (most specific first) -------------------------------------------------------

#: Named failure patterns: (failure class, name, compiled regex). The first match wins.
LOG_PATTERNS: list[tuple[FailureClass, str, re.Pattern[str]]] = [
    (
        "oom",
        "cuda_oom",
        re.compile(
            r"CUDA out of memory[^\n]*|torch\.OutOfMemoryError[^\n]*|OutOfMemoryError[^\n]*"
            r"|CUBLAS_STATUS_ALLOC_FAILED[^\n]*|\bout of memory\b[^\n]*",
            re.I,
        ),
    ),
    (
        "nan",
        "nan_loss",
        re.compile(
            r"found NaN in[^\n]*|\bNaN (?:loss|detected)[^\n]*|loss is (?:nan|inf)[^\n]*"
            r"|number of nan iterations:\s*[1-9]\d*|reduced_train_loss[=:]\s*nan[^\n]*",
            re.I,
        ),
    ),
    (
        "hang",
        "nccl_timeout",
        re.compile(
            r"Watchdog caught collective operation timeout[^\n]*|NCCL (?:communicator )?"
            r"timeout[^\n]*|Timeout at NCCL work[^\n]*|collective operation timeout[^\n]*",
            re.I,
        ),
    ),
    (
        "error",
        "nccl_error",
        re.compile(r"NCCL error[^\n]*|ncclSystemError[^\n]*|ncclInternalError[^\n]*", re.I),
    ),
    (
        "invalid",
        "unrecognized_arguments",
        re.compile(r"error: unrecognized arguments:[^\n]*|error: argument [^\n]*"),
    ),
    (
        "invalid",
        "unknown_recipe",
        # Bridge's run_recipe.py (recipe_runner.load_recipe) for a --recipe it lacks
        re.compile(r"Recipe '[^']+' (?:not found in megatron\.bridge|is indexed but not)[^\n]*"),
    ),
    (
        "invalid",
        "override_rejected",
        re.compile(
            r"Could not override '[^\n]*|Key '[^']+' not in '[^\n]*"
            r"|ConfigAttributeError[^\n]*|Error merging override[^\n]*"
        ),
    ),
]

#: A Python exception line: ``AssertionError: message``.
_EXCEPTION_LINE = re.compile(
    r"^(?:\S+:\s*)?(?:[\w.]+\.)?(?P<exc>AssertionError|ValueError|TypeError|KeyError)"
    r"(?::\s*(?P<msg>.*))?$",
    re.M,
)
#: Traceback frames of configuration validation (Megatron-LM ``validate_args``, Megatron-
#: Core config ``__post_init__``, Bridge ``ConfigContainer.validate`` / ``finalize``).
_VALIDATION_FRAME = re.compile(
    r'File "[^"]*\.py", line \d+, in (?:validate_args|__post_init__|validate|finalize)\b'
)


def classify_failure(text: str) -> tuple[FailureClass, str] | None:
    """(failure class, message) a log shows, or None when it shows no known failure.

    Classes: ``oom``, ``nan``, ``hang`` (NCCL collective timeout), ``error`` (NCCL
    error), ``invalid`` (a configuration validation error, an unrecognized argument or a
    rejected override, with the recipe's own message).
    """
    for cls, _name, rx in LOG_PATTERNS:
        m = rx.search(text)
        if m:
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            return cls, text[start : end if end >= 0 else len(text)].strip()
    # Megatron's checks are assertions (Megatron-LM validate_args, Megatron-Core modules);
    # a ValueError/TypeError/KeyError counts when raised from a config validation frame.
    excs = list(_EXCEPTION_LINE.finditer(text))
    if excs:
        m = excs[-1]
        if m.group("exc") == "AssertionError" or _VALIDATION_FRAME.search(text):
            msg = (m.group("msg") or "").strip() or m.group("exc")
            return "invalid", msg
    return None


def classify_log(text: str) -> FailureClass:
    """The failure class a crashed trial's log suggests (``error`` when nothing matches)."""
    found = classify_failure(text)
    return found[0] if found else "error"


# --- parsing ------------------------------------------------------------------------------


@dataclass
class LogStep:
    """One logged iteration (``step`` is 1-based: the iterations done when it was logged)."""

    step: int
    step_time_s: float | None = None
    tflops_per_gpu: float | None = None
    loss: float | None = None
    grad_norm: float | None = None


@dataclass
class ParsedLog:
    format: str
    steps: list[LogStep] = field(default_factory=list)
    total_steps: int | None = None
    peak_mem_gib: float | None = None
    peak_reserved_gib: float | None = None
    failure: tuple[FailureClass, str] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def log_interval(self) -> int | None:
        """Iterations between logged lines (None with fewer than two lines)."""
        its = [s.step for s in self.steps]
        gaps = {b - a for a, b in zip(its, its[1:], strict=False)}
        return min(gaps) if gaps else None

    def summary(
        self,
        warmup_steps: int = 1,
        *,
        flops_per_step: float | None = None,
        world_size: int | None = None,
    ) -> dict[str, Any]:
        """What a trial records from this log.

        ``step_time_s`` is the median over the logged iterations after ``warmup_steps`` (all
        of them when none is left). ``tflops_per_gpu`` is dse's one FLOP definition: the
        model FLOPs of a step (``flops_per_step``, :mod:`dse.model.flops`) over that step time
        (None without ``flops_per_step`` and ``world_size``). The log's own figure, where it
        prints one, is ``tflops_per_gpu_log`` with its origin in ``tflops_log_source``; it is
        never the objective (recipes count FLOPs differently: NeMo without the causal
        halving, Bridge 0 for hybrid models, a VLM card with its vision tower).
        """
        notes = list(self.notes)
        timed = [s for s in self.steps if s.step_time_s is not None]
        steady = [s for s in timed if s.step > warmup_steps] or timed
        step_time = statistics.median(s.step_time_s for s in steady) if steady else None  # type: ignore[type-var]
        logged_tf = [s.tflops_per_gpu for s in steady if s.tflops_per_gpu is not None]
        tflops: float | None = None
        source: str | None = None
        if step_time and flops_per_step and world_size:
            tflops = tflops_per_gpu(flops_per_step, step_time, world_size)
            source = "computed"
        elif step_time:
            notes.append("TFLOP/s needs the model: give the space file to compute it")
        log_tf = statistics.median(logged_tf) if logged_tf else None
        # a NaN/inf loss is None here (JSON has no NaN); the failure says "nan"
        losses = [
            s.loss if math.isfinite(s.loss) else None for s in self.steps if s.loss is not None
        ]
        return {
            "format": self.format,
            "tflops_per_gpu": tflops,
            "tflops_source": source,
            "tflops_per_gpu_log": log_tf,
            "tflops_log_source": TFLOPS_LOG_FIELD.get(self.format) if log_tf is not None else None,
            "step_time_s": step_time,
            "loss": losses,
            "peak_mem_gib": self.peak_mem_gib,
            "peak_reserved_gib": self.peak_reserved_gib,
            "steps": self.steps[-1].step if self.steps else 0,
            "logged_steps": len(self.steps),
            "log_interval": self.log_interval,
            "warmup_steps": warmup_steps,
            "failure": None
            if self.failure is None
            else {"class": self.failure[0], "reason": self.failure[1]},
            "notes": notes,
        }


def _fields(rest: str) -> dict[str, str]:
    return {m.group("key").strip(): m.group("value").strip() for m in FIELD.finditer(rest)}


def _float(x: str | None) -> float | None:
    if x is None or x == "":
        return None
    try:
        return float(x)
    except ValueError:
        return None


def detect_format(text: str) -> str:
    """``nemo``, ``bridge`` or ``megatron`` by the lines a log holds (megatron by default)."""
    if NEMO_ITERATION.search(text) or NEMO_PROGRESS_BAR.search(text):
        return "nemo"
    if BRIDGE_STEP_TIME.search(text) or BRIDGE_MEMORY.search(text):
        return "bridge"
    return "megatron"


class LogParser:
    """Incremental parser: feed lines as the recipe writes them, read ``result``."""

    def __init__(self, fmt: str = "auto") -> None:
        if fmt not in ("auto", *LOG_FORMATS):
            raise ValueError(f"unknown log format {fmt!r}; known: auto, {', '.join(LOG_FORMATS)}")
        self.format = fmt
        self.result = ParsedLog(format=fmt)
        self._by_step: dict[int, LogStep] = {}
        self._pending_tflops: float | None = None
        self._tail: list[str] = []
        self._upstream_megatron = False  # upstream Megatron-LM's argument table was read
        self._first: LogStep | None = None  # its iteration 1, logged without a reset

    def _step(self, step: int) -> tuple[LogStep, bool]:
        s = self._by_step.get(step)
        if s is not None:
            return s, False
        s = LogStep(step)
        self._by_step[step] = s
        self.result.steps.append(s)
        return s, True

    def feed(self, line: str) -> LogStep | None:
        """Parse one line; returns the step when the line logged a new iteration."""
        self._tail.append(line)
        if len(self._tail) > 400:
            del self._tail[:200]
        new: LogStep | None = None
        if self.format in ("auto", "nemo"):
            m = NEMO_ITERATION.search(line)
            if m:
                self._set_format("nemo")
                f = _fields(m.group("rest"))
                s, fresh = self._step(int(m.group("it")) + 1)
                self.result.total_steps = int(m.group("total"))
                s.step_time_s = s.step_time_s or _float(f.get("train_step_timing in s"))
                s.tflops_per_gpu = s.tflops_per_gpu or _float(f.get("TFLOPS_per_GPU"))
                loss = _float(f.get("reduced_train_loss"))
                s.loss = s.loss if s.loss is not None else loss
                self._nemo_memory(f)
                return s if fresh else None
            new_bar: LogStep | None = None
            for part in line.split("\r"):  # tqdm redraws the bar on one line
                m = NEMO_PROGRESS_BAR.search(part)
                if not m:
                    continue
                self._set_format("nemo")
                f = {b.group("key").strip(): b.group("value").strip()
                     for b in BAR_FIELD.finditer(m.group("rest"))}  # fmt: skip
                gs = _float(f.get("global_step"))
                s, fresh = self._step(int(gs) + 1 if gs is not None else int(m.group("it")))
                self.result.total_steps = int(m.group("total"))
                s.step_time_s = s.step_time_s or _float(f.get("train_step_timing in s"))
                s.tflops_per_gpu = s.tflops_per_gpu or _float(f.get("TFLOPS_per_GPU"))
                self._nemo_memory(f)
                bar_loss = f.get("reduced_train_loss")
                if bar_loss is not None:
                    nan = bar_loss.lower().startswith("nan")
                    s.loss = float("nan") if nan else _float(bar_loss)
                if fresh:
                    new_bar = s
            if new_bar is not None or NEMO_PROGRESS_BAR.search(line):
                return new_bar
        if self.format in ("auto", "bridge"):
            m = BRIDGE_STEP_TIME.search(line)
            if m:
                self._set_format("bridge")
                self._pending_tflops = float(m.group("tf"))
                return None
            m = BRIDGE_MEMORY.search(line)
            if m:
                self._set_format("bridge")
                r = _float(m.group("reserved"))
                self._peak(
                    float(m.group("alloc")) * 1e9 / _GIB, None if r is None else r * 1e9 / _GIB
                )
                return None
        if self.format in ("auto", "megatron") and MEGATRON_ARGS_END.search(line):
            self._upstream_megatron = True
            return None
        if self.format in ("auto", "megatron", "bridge"):
            m = MEGATRON_MEMORY.search(line)
            if m:
                r = _float(m.group("reserved"))
                self._peak(float(m.group("alloc")) / 1024, None if r is None else r / 1024)
                return None
            m = MEGATRON_ITERATION.search(line)
            if m and "elapsed time per iteration" in line:
                f = _fields(m.group("rest"))
                s, fresh = self._step(int(m.group("it")))
                self.result.total_steps = int(m.group("total"))
                ms = _float(f.get("elapsed time per iteration (ms)"))
                if ms is not None and s.step_time_s is None:
                    s.step_time_s = ms / 1000.0
                tf = _float(f.get("throughput per GPU (TFLOP/s/GPU)"))
                if tf is None and self._pending_tflops is not None:
                    tf = self._pending_tflops
                self._pending_tflops = None
                if s.tflops_per_gpu is None:
                    s.tflops_per_gpu = tf
                if s.loss is None:
                    s.loss = _float(f.get("lm loss"))
                if s.grad_norm is None:
                    s.grad_norm = _float(f.get("grad norm"))
                if fresh and self._upstream_megatron:
                    self._first_interval(s)
                new = s if fresh else None
        return new

    def _first_interval(self, s: LogStep) -> None:
        """Upstream Megatron-LM (core_v0.16.1, ``training_log``'s ``is_first_iteration``)
        logs iteration 1 without resetting its accumulators: the next line's loss and
        elapsed time per iteration are the means over iterations 1..n. Here they become the
        means over 2..n (with ``--log-interval 1``: iteration 2's own), and the log's
        TFLOP/s with them."""
        if s.step == 1:
            self._first = s
            return
        first, self._first = self._first, None
        if first is None or s.step < 2:
            return
        n = s.step
        if s.loss is not None and first.loss is not None and math.isfinite(s.loss):
            s.loss = (n * s.loss - first.loss) / (n - 1)
        if s.step_time_s is not None and first.step_time_s is not None:
            own = (n * s.step_time_s - first.step_time_s) / (n - 1)
            if own > 0:
                if s.tflops_per_gpu is not None:
                    s.tflops_per_gpu *= s.step_time_s / own
                s.step_time_s = own
        self.result.notes.append(
            f"iteration {n}: loss and step time of iterations 2..{n} (upstream Megatron-LM "
            "logs iteration 1 without resetting its accumulators)"
        )

    def _nemo_memory(self, f: dict[str, str]) -> None:
        """NeMo's memory fields of one line (bytes): the allocated peak is the peak memory,
        the reserved one the reserved peak; ``peak_memory_usage`` alone stands for both."""
        alloc, reserved, peak = (_float(f.get(k)) for k in NEMO_MEMORY_FIELDS)
        if alloc is None and reserved is None and peak is None:
            return
        if alloc is None:
            alloc = peak if peak is not None else reserved
        if reserved is None:
            reserved = peak
        assert alloc is not None
        self._peak(alloc / _GIB, None if reserved is None else reserved / _GIB)

    def _set_format(self, fmt: str) -> None:
        if self.format == "auto" or self.result.format == "auto":
            self.result.format = fmt

    def _peak(self, alloc: float, reserved: float | None) -> None:
        r = self.result
        r.peak_mem_gib = alloc if r.peak_mem_gib is None else max(r.peak_mem_gib, alloc)
        if reserved is not None:
            r.peak_reserved_gib = (
                reserved if r.peak_reserved_gib is None else max(r.peak_reserved_gib, reserved)
            )

    def finish(self, text: str | None = None) -> ParsedLog:
        """Classify failures (from ``text``, or the lines fed) and return the result."""
        if self.result.format == "auto":
            self.result.format = "megatron" if self.format == "auto" else self.format
        self.result.failure = classify_failure(text if text is not None else "\n".join(self._tail))
        return self.result


def parse_log(lines: Iterable[str] | str, fmt: str = "auto") -> ParsedLog:
    """Parse a whole log (text or lines)."""
    text = lines if isinstance(lines, str) else "".join(lines)
    if fmt == "auto":
        fmt = detect_format(text)
    p = LogParser(fmt)
    for line in text.splitlines():
        p.feed(line)
    return p.finish(text)
