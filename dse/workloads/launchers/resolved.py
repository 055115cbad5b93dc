"""The resolved-configuration check: what the recipe ran with against what dse asked.

A launcher trial reads back the configuration the recipe actually resolved (after its own
validation and defaults) and compares every field dse set with the value it asked. A field
that differs fails the trial as ``invalid`` naming the field, the value asked and the value
resolved: the recipe overwrote a knob (Megatron-LM's ``validate_args`` turning
``sequence_parallel`` off at TP=1; Bridge's mixed-precision setup copying its
``grad_reduce_in_fp32`` onto the DDP config), so the trial did not measure what dse meant.

What each recipe prints, and who reads it:

* Megatron-LM: ``pretrain_gpt.py`` prints its whole argument namespace after
  ``validate_args`` (``megatron/training/arguments.py`` ``_print_args``): a line
  ``---- arguments ----``, one ``  name ....... value`` line per argument (sorted, dots to
  column 48, two spaces where the name is longer), ``---- end of arguments ----``.
  :class:`ArgsTableReader` collects it from the trial's log.
* Megatron-Bridge: dse's own entry script (:mod:`dse.workloads.launchers.bridge_entry`)
  writes ``resolved.json`` into the trial folder after ``runtime_config_update``.
* NeMo 2.0: nothing the recipe prints is read; before the trial starts it, its rendered
  overrides are resolved by NeMo itself (:mod:`.nemo_installed`: NeMo's own factory, the
  overrides applied to NeMo-Run's config objects, ``MegatronStrategy.connect``), in an
  interpreter that has NeMo 2.0 (``DSE_NEMO_PYTHON``, or the trial's own where ``nemo``
  imports). Without one the trial runs unchecked and its log says so.

The expectations (what dse asked, by the recipe's own field names) come from each target's
plugin; :func:`compare` is the one comparison.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dse.space.searchspace import ModelSpec
from dse.workloads.launchers._compare import Mismatch, compare, normalize
from dse.workloads.launchers.bridge import resolved_expectations as bridge_expect
from dse.workloads.launchers.megatron_lm import ARG_DEFAULTS, BUILTIN_MODULE, resolved_expectations
from dse.workloads.launchers.nemo_installed import request_for, resolvable, resolve_before_run

if TYPE_CHECKING:
    from dse.workloads.launchers.nemo_installed import BeforeRun

__all__ = [
    "ArgsTableReader",
    "Mismatch",
    "RESOLVED_ENV",
    "RESOLVED_FILE",
    "ResolvedCheck",
    "check_for",
    "compare",
    "flatten",
    "mismatch_reason",
    "normalize",
    "read_resolved_file",
]

#: The file dse's Bridge entry script writes into the trial folder ...
RESOLVED_FILE = "resolved.json"
#: ... at the path the trial process gives it in this environment variable.
RESOLVED_ENV = "DSE_RESOLVED_FILE"

#: ``------------------------ arguments ------------------------``
ARGS_BEGIN = re.compile(r"^-{8,} arguments -{8,}\s*$")
#: ``-------------------- end of arguments ---------------------``
ARGS_END = re.compile(r"^-{8,} end of arguments -{8,}\s*$")
#: ``  name ........ value`` (or ``  name  value`` for a name of 48+ characters).
ARGS_LINE = re.compile(r"^  (?P<name>[A-Za-z_][A-Za-z0-9_]*) (?:\.+ |\s)(?P<value>.*)$")
#: A rank prefix that torchrun --tee or srun -l adds (``[rank0]:``, ``0: ``).
_RANK_PREFIX = re.compile(r"^(?:\[rank\d+\]:|\d+: )")


class ArgsTableReader:
    """Collects Megatron-LM's printed argument table from log lines as they come."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}
        self.started = False
        self.done = False

    def feed(self, line: str) -> bool:
        """Read one line; True when this line ended the table."""
        if self.done:
            return False
        text = _RANK_PREFIX.sub("", line.rstrip("\r\n"))
        if not self.started:
            self.started = bool(ARGS_BEGIN.match(text))
            return False
        if ARGS_END.match(text):
            self.done = True
            return True
        m = ARGS_LINE.match(text)
        if m:
            self.values[m.group("name")] = m.group("value").rstrip()
        return False


def mismatch_reason(target: str, mismatches: Iterable[Mismatch], origin: str) -> str:
    """The ``invalid`` reason of a trial whose recipe resolved other values than asked."""
    items = "; ".join(str(m) for m in mismatches)
    return f"the {target} recipe resolved another configuration than dse asked ({origin}): {items}"


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dump as dotted keys (``{"model": {"a": 1}}`` -> ``{"model.a": 1}``)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and not (set(v) <= {"_target_", "_call_"} and v):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


@dataclass
class ResolvedFile:
    """``resolved.json`` of a trial folder: the recipe's resolved fields, dotted keys."""

    fields: dict[str, Any] = field(default_factory=dict)
    source: str = ""


def read_resolved_file(path: str | Path) -> ResolvedFile | None:
    """The resolved fields a dse entry script dumped (None when the file is absent)."""
    p = Path(path)
    if not p.is_file():
        return None
    data = json.loads(p.read_text())
    return ResolvedFile(fields=dict(data.get("fields") or {}), source=str(data.get("source", "")))


class ResolvedCheck:
    """The check of one trial: the fields asked, and where the resolved ones come from.

    ``start`` before the recipe starts (a recipe resolved ahead: NeMo 2.0's, by ``ahead``);
    ``feed`` each log line (Megatron-LM's argument table comes in the log); ``finish`` after
    the recipe exits (a resolved file the entry script wrote). Each returns the ``invalid``
    reason once a field differs, else None; ``note`` says what was checked.
    """

    def __init__(
        self, target: str, asked: Mapping[str, Any], *, table: bool = False,
        file: str | Path | None = None, defaults: Mapping[str, Any] | None = None,
        ahead: Callable[[], BeforeRun] | None = None,
    ) -> None:  # fmt: skip
        self.target = target
        self.asked = dict(asked)
        self.defaults = dict(defaults or {})
        self.reader = ArgsTableReader() if table else None
        self.file = Path(file) if file is not None else None
        self.ahead = ahead
        self.checked = False
        self.note = ""

    def start(self) -> str | None:
        """Before the recipe starts: where it is resolved ahead, the ``invalid`` reason once a
        field differs or the recipe refuses the configuration; else None (``note`` says what
        was checked, or why nothing was)."""
        if self.ahead is None or self.checked:
            return None
        got = self.ahead()
        self.checked = True
        if got.why_not is not None:
            self.note = (
                f"resolved-configuration check: {got.why_not}; "
                f"{len(self.asked)} fields not checked"
            )
            return None
        if got.error is not None:
            return (
                f"the {self.target} recipe refused the configuration dse asked ({got.origin}): "
                f"{got.error}"
            )
        if got.mismatches:
            return mismatch_reason(self.target, got.mismatches, got.origin)
        self.note = (
            f"resolved-configuration check: {len(self.asked)} fields as asked ({got.origin})"
        )
        return None

    def feed(self, line: str) -> str | None:
        if self.reader is None or self.checked or not self.reader.feed(line):
            return None
        return self._compare(self.reader.values, "its printed argument table")

    def finish(self) -> str | None:
        if self.checked:
            return None
        if self.file is not None:
            found = read_resolved_file(self.file)
            if found is not None:
                return self._compare(found.fields, found.source or self.file.name)
        where = "argument table" if self.reader is not None else f"{RESOLVED_FILE}"
        self.note = (
            f"resolved-configuration check: the recipe wrote no {where}; "
            f"{len(self.asked)} fields not checked"
        )
        return None

    def _compare(self, resolved: Mapping[str, Any], origin: str) -> str | None:
        self.checked = True
        bad = compare(self.asked, resolved, self.defaults)
        if bad:
            return mismatch_reason(self.target, bad, origin)
        self.note = f"resolved-configuration check: {len(self.asked)} fields as asked ({origin})"
        return None


def check_for(spec: Any, argv: list[str], trial_dir: str | Path) -> ResolvedCheck | None:
    """The resolved-configuration check of a launcher trial (``spec``: its TrialSpec), or None
    where the space turned it off (``workload.launcher.check_resolved: false``), the command
    runs dse's built-in trainer (which resolves nothing of its own) or a NeMo module or script
    of the space's own (not NeMo's factory)."""

    wl = spec.workload or {}
    launcher = wl.get("launcher") or {}
    if launcher.get("check_resolved", True) is False:
        return None
    target = (wl.get("rendered") or {}).get("launcher") or wl.get("name")
    if target == "megatron_lm":
        if launcher.get("module") == BUILTIN_MODULE:
            return None
        model = ModelSpec.model_validate(spec.model)
        inactive = set((wl.get("rendered") or {}).get("inactive") or ())
        params = {k: v for k, v in spec.params.items() if k not in inactive}
        asked = resolved_expectations(params, model, argv)
        return ResolvedCheck(target, asked, table=True, defaults=ARG_DEFAULTS)
    if target == "bridge":
        asked = bridge_expect(argv)
        if not asked:
            return None
        return ResolvedCheck(target, asked, file=Path(trial_dir) / RESOLVED_FILE)
    if target == "nemo":
        # NeMo's factory by its name; a module or script of the space's own is not resolved
        if not launcher.get("recipe") or not resolvable(
            launcher.get("module"), launcher.get("script")
        ):
            return None
        req = request_for(launcher["recipe"], launcher.get("task"), argv)
        if req is None:
            return None
        env = {**os.environ, **((wl.get("rendered") or {}).get("env") or {})}
        asked = dict(item.split("=", 1) for item in req["overrides"])
        return ResolvedCheck(target, asked, ahead=partial(resolve_before_run, req, env))
    return None
