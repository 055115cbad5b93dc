"""The launcher core: a trial of a user's recipe as a command line and an environment.

Every knob value becomes the recipe's own override, in its own syntax, from the knob
catalog's field mapping (:func:`dse.space.knobs.assignments`); a knob value the recipe cannot take
raises :class:`NotTaken` (``dse validate`` reports it and exits 2). Environment knobs
(``env.VAR``) and the space's ``env.fixed`` become the environment of every rank.
"""

from __future__ import annotations

import contextlib
import math
import re
import shlex
import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from dse.core.exceptions import SpaceError
from dse.core.registry import REGISTRY
from dse.model.rules import check
from dse.space.knobs import FieldAssignment, assignments, effective_params, trial_env
from dse.space.recipe_spec import NODE_STEPS, LauncherSpec

if TYPE_CHECKING:
    from dse.space.searchspace import LoraSpec, MoeRouting, SearchSpace

__all__ = [
    "Launcher",
    "NotTaken",
    "RenderedTrial",
    "shell_word",
    "check_launcher",
    "run_node_steps",
    "launcher_for",
    "routing_fields",
    "lora_fields",
    "packing_fields",
]


class NotTaken(Exception):
    """A knob value the recipe cannot take (no override of the recipe expresses it)."""

    def __init__(self, knob: str, value: Any, why: str) -> None:
        super().__init__(f"{knob}={value!r}: {why}")
        self.knob = knob
        self.value = value
        self.why = why


#: The placeholders a recipe's command may hold for its rendezvous (written by
#: :meth:`Launcher.torchrun`): a shell expands them; everything else is quoted as it is.
RDZV_PLACEHOLDER = re.compile(r"(\$\{(?:MASTER_ADDR|MASTER_PORT)\})")


def shell_word(arg: str) -> str:
    """``arg`` as one shell word: quoted, with the rendezvous placeholders left for the
    shell to expand (``--rdzv-endpoint="${MASTER_ADDR}":"${MASTER_PORT}"``). Any other
    ``$``, backquote or quote of an override stays literal text."""
    parts = RDZV_PLACEHOLDER.split(arg)
    return (
        "".join(f'"{p}"' if RDZV_PLACEHOLDER.fullmatch(p) else shlex.quote(p) for p in parts if p)
        or "''"
    )


@dataclass(frozen=True)
class RenderedTrial:
    """A trial of a recipe: the command, the environment of every rank, node steps."""

    launcher: str
    argv: list[str]
    env: dict[str, str]
    node_steps: list[list[str]] = field(default_factory=list)
    container_image: str | None = None
    log_format: str = "megatron"
    world_size: int = 1
    nodes: int = 1
    node_step_names: list[str] = field(default_factory=list)
    #: Tasks Slurm starts per node: 1 for a recipe started by torchrun (it starts the ranks);
    #: one per GPU for NeMo, whose Lightning takes its ranks from Slurm's tasks (NeMo-Run's
    #: SlurmExecutor without a torchrun launcher: ``--ntasks-per-node`` = GPUs per node).
    tasks_per_node: int = 1
    #: Conditional knobs whose condition does not hold in this trial: nothing of them is
    #: passed (``moe_flex_dispatcher_backend`` without the flex dispatcher).
    inactive: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The trial spec's ``workload.rendered`` (what the trial process runs)."""
        import dataclasses

        return dataclasses.asdict(self)

    def script(self) -> str:
        """The trial as shell text (what ``dse start --dry-run`` prints)."""
        lines = [f"# launcher: {self.launcher}, {self.world_size} GPU(s) on {self.nodes} node(s)"]
        if self.container_image:  # a comment: a line break in it would start a command
            img = self.container_image
            lines.append(f"# container image: {img if img.isprintable() else repr(img)}")
        for step in self.node_steps:
            lines.append(f"# pre-trial node step (skipped with a note if not permitted): "
                         f"{shlex.join(step)}")  # fmt: skip
        lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        q = [shell_word(a) for a in self.argv]
        parts: list[str] = []
        for a in q:  # a flag and its value on one line
            prev = parts[-1] if parts else ""
            flag = (prev.startswith("--") and " " not in prev and "=" not in prev) or prev == "-m"
            if flag and not a.startswith("-") and "=" not in a:
                parts[-1] += " " + a
            else:
                parts.append(a)
        lines.append(" \\\n    ".join(parts))
        return "\n".join(lines) + "\n"


def _layout(space: SearchSpace) -> tuple[int, int, int]:
    """(world size, GPUs per node, nodes) of a trial."""
    r = space.resources
    world = r.world_size
    per = min(r.gpus_per_node or world, world)
    return world, per, math.ceil(world / per)


class Launcher(ABC):
    """How one kind of recipe is launched and how knob values become its overrides."""

    name: ClassVar[str]
    log_format: ClassVar[str]
    #: Slurm starts one task per GPU (the recipe takes its ranks from Slurm), not one per node.
    task_per_gpu: ClassVar[bool] = False

    def __init__(self, space: SearchSpace) -> None:
        if space.workload.launcher is None:
            raise SpaceError(f"workload {space.workload.name!r} needs a workload.launcher section")
        self.space = space
        self.spec: LauncherSpec = space.workload.launcher

    # --- what each launcher says ----------------------------------------------------------
    @abstractmethod
    def entry(self, python: str | None) -> list[str]:
        """The command up to the overrides (launcher, script, recipe selection)."""

    @abstractmethod
    def knob_overrides(self, params: Mapping[str, Any]) -> list[str]:
        """The recipe's overrides for the knob values of ``params`` (raises NotTaken)."""

    @abstractmethod
    def semantics_overrides(self) -> list[str]:
        """Overrides that pin the space's fixed semantics (steps, batch, sequence, logging)."""

    @abstractmethod
    def fixed_overrides(self) -> list[str]:
        """``workload.launcher.overrides`` in the recipe's syntax."""

    def base_env(self) -> dict[str, str]:
        """Environment the launcher itself needs (e.g. NeMo's memory logging)."""
        return {}

    @staticmethod
    def override_key(item: str) -> str:
        """The key an override sets (``a.b=1`` -> ``a.b``; ``--flag`` -> ``--flag``)."""
        return item.split("=", 1)[0].lstrip("+~")

    # --- shared ----------------------------------------------------------------------------
    def torchrun(self, python: str | None) -> list[str]:
        world, per, nodes = _layout(self.space)
        head = [python, "-m", "torch.distributed.run"] if python else ["torchrun"]
        if nodes == 1:
            return [*head, "--standalone", f"--nproc-per-node={per}"]
        return [
            *head, f"--nnodes={nodes}", f"--nproc-per-node={per}", "--rdzv-backend=c10d",
            "--rdzv-endpoint=${MASTER_ADDR}:${MASTER_PORT}",
        ]  # fmt: skip

    def render(self, params: Mapping[str, Any], *, python: str | None = None) -> RenderedTrial:
        """The command and environment of a trial with knob values ``params`` (fixed knobs
        included). Raises :class:`NotTaken` for a value the recipe cannot take and
        :class:`SpaceError` when a knob and a fixed override set the same thing. A
        conditional knob whose condition does not hold passes nothing."""
        inactive = self.inactive_knobs(params)
        params = {k: v for k, v in params.items() if k not in inactive}
        knob_ov = self.knob_overrides(params)
        fixed = self.semantics_overrides() + self.fixed_overrides()
        knob_keys = {self.override_key(o) for o in knob_ov if self._is_key(o)}
        clash = sorted(knob_keys & {self.override_key(o) for o in fixed if self._is_key(o)})
        if clash:
            raise SpaceError(
                f"workload.launcher: {clash} set both by a knob and by the fixed overrides "
                "(or the semantics section); give each in one place"
            )
        world, per, nodes = _layout(self.space)
        env = {**self.base_env(), **trial_env(params, self.space.env.fixed)}
        return RenderedTrial(
            launcher=self.name,
            argv=[*self.entry(python), *fixed, *knob_ov],
            env=env,
            node_steps=[list(NODE_STEPS[s]) for s in self.space.env.node_steps],
            node_step_names=list(self.space.env.node_steps),
            container_image=self.spec.container_image,
            log_format=self.spec.log_format if self.spec.log_format != "auto" else self.log_format,
            world_size=world,
            nodes=nodes,
            tasks_per_node=per if self.task_per_gpu else 1,
            inactive=sorted(inactive),
        )

    def inactive_knobs(self, params: Mapping[str, Any]) -> set[str]:
        """The knobs of ``params`` that do nothing there
        (:meth:`dse.space.searchspace.SearchSpace.inactive_knobs`): a conditional knob
        whose condition does not hold, a value Megatron-Core does not read."""
        return self.space.inactive_knobs(params) & set(params)

    def check_installed(self) -> str | None:
        """What the installed recipe package says against this space (a recipe it lacks),
        or None where it agrees or is not importable here."""
        return None

    def check_resolution(self, argvs: list[list[str]]) -> list[str]:
        """Where the recipe can be resolved on this machine: each field it resolves to another
        value than one of ``argvs`` (rendered commands) asks, e.g. a knob it overwrites."""
        return []

    def _is_key(self, item: str) -> bool:
        return "=" in item or item.startswith("--")

    @staticmethod
    def assignments_of(params: Mapping[str, Any]) -> list[tuple[str, Any, FieldAssignment]]:
        """(knob, value, field assignment) of every non-environment assignment."""
        out = []
        for name, value in effective_params(params).items():
            for a in assignments({name: value}):
                if a.section != "env":
                    out.append((name, value, a))
        return out


def check_launcher(space: SearchSpace, source: str = "<space>") -> int:
    """Render every value of every knob (others at the baseline) through the space's
    launcher; raise :class:`SpaceError` naming each knob value the recipe cannot take.
    Returns the number of renderings checked."""
    launcher = launcher_for(space)
    base = space.full_params(space.baseline())
    problems: list[str] = []
    n = 0
    seen: set[tuple[str, str]] = set()
    argvs: list[list[str]] = []  # the renderings the recipe is resolved on, where it can be
    try:  # the semantics (a routing field the recipe has no name for), once, by its path
        launcher.semantics_overrides()
    except NotTaken as e:
        seen.add((e.knob, repr(e.value)))
        problems.append(
            f"{source}: {e.knob}: the {launcher.name} recipe cannot take "
            f"{e.knob}={e.value!r}: {e.why}"
        )

    def resolvable(params: dict[str, Any]) -> bool:
        # the recipe is resolved only on configurations the rules let run (a knob value
        # against the baseline may break a constraint the space states, e.g. SP without TP)
        return not check(space, params)

    with contextlib.suppress(NotTaken):
        argvs.append(launcher.render(base).argv)
    for name, spec in space.knobs.items():
        active = {}  # a conditional knob is checked where its condition holds
        for other, want in (spec.when or {}).items():
            if other in space.knobs:
                active[other] = want[0] if isinstance(want, list) else want
        for v in spec.values():
            try:
                variant = {**base, **active, name: v}
                argv = launcher.render(variant).argv
                if resolvable(variant):
                    argvs.append(argv)
                n += 1
            except NotTaken as e:
                key = (e.knob, repr(e.value))
                if key not in seen:
                    seen.add(key)
                    problems.append(
                        f"{source}: knobs.{e.knob}: the {launcher.name} recipe cannot take "
                        f"{e.knob}={e.value!r}: {e.why}"
                    )
    for name, v in space.fixed.items():
        try:
            launcher.render({**base, name: v})
        except NotTaken as e:
            if (e.knob, repr(e.value)) in seen:
                continue
            problems.append(
                f"{source}: fixed.{e.knob}: the {launcher.name} recipe cannot take "
                f"{e.knob}={e.value!r}: {e.why}"
            )
    installed = launcher.check_installed()
    if installed:
        problems.append(f"{source}: workload.launcher.recipe: {installed}")
    elif not problems:
        problems += [
            f"{source}: workload.launcher.recipe: {p}" for p in launcher.check_resolution(argvs)
        ]
    if problems:
        raise SpaceError("\n".join(problems))
    return n


def run_node_steps(steps: list[str]) -> list[str]:
    """Run pre-trial node steps; returns notes for the ones skipped (never raises)."""
    notes: list[str] = []
    for s in steps:
        cmd = NODE_STEPS[s]
        if shutil.which(cmd[0]) is None:
            notes.append(f"node step {s} skipped: {cmd[0]} not found here")
            continue
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            notes.append(f"node step {s} skipped: {e}")
            continue
        if r.returncode != 0:
            why = (r.stderr or r.stdout).strip().splitlines()
            notes.append(
                f"node step {s} not permitted here (exit {r.returncode}): "
                f"{why[-1] if why else 'no message'}"
            )
    return notes


def launcher_for(space: SearchSpace) -> Launcher:
    """The launcher of a space whose workload is a recipe launcher (the ``launcher`` entries
    of :data:`dse.core.registry.REGISTRY`: ``bridge``, ``nemo``, ``megatron_lm``)."""

    names = REGISTRY.names("launcher")
    if space.workload.name not in names:
        raise SpaceError(
            f"workload {space.workload.name!r} is not a recipe launcher ({sorted(names)})"
        )
    cls: type[Launcher] = REGISTRY.get("launcher", space.workload.name).load()
    return cls(space)


def routing_fields(routing: MoeRouting | None) -> list[tuple[str, Any]]:
    """(``TransformerConfig`` field, value) of every field of ``semantics.moe_routing`` (none
    for None: the recipe's routing stands), each of them, also at Megatron's default: a
    recipe that sets its own routing does not keep it over the declared one."""
    return [] if routing is None else list(routing.model_dump().items())


def lora_fields(peft: LoraSpec | None) -> list[tuple[str, Any]]:
    """(field, value) of the recipe's PEFT object a LoRA study sets, every one (none without
    PEFT). The names are the ``LoRA`` dataclass fields of Megatron-Bridge
    (src/megatron/bridge/peft/lora.py) and NeMo (nemo/collections/llm/peft/lora.py), both
    ``target_modules``, ``dim``, ``alpha``, ``dropout``; the recipe must be a PEFT recipe
    (Bridge's ``*_peft_config``, NeMo's ``finetune`` with ``peft_scheme='lora'``), whose
    ``peft`` object they override. The pinned upstream name tables
    (tests/fixtures/upstream) hold only the PEFT base class, so these four are checked by
    ``tests/workloads/test_training_semantics.py`` against those files' text instead."""
    if peft is None:
        return []
    return [
        ("target_modules", list(peft.target_modules)),
        ("dim", peft.dim),
        ("alpha", peft.alpha),
        ("dropout", peft.dropout),
    ]


def packing_fields(packed: bool, seq_length: int, tool: str) -> list[tuple[str, Any]]:
    """(dotted key, value) of a recipe's packed-sequence settings for a packed study
    (``semantics.packed_sequences``; none otherwise). Each packed row holds
    ``seq_length`` tokens. ``tool``: ``bridge`` sets its SFT dataset's offline packing
    (``GPTSFTDatasetConfig.enable_offline_packing`` and ``offline_packing_specs``, a
    ``megatron.bridge.data.packing.PackedSequenceSpecs``); ``nemo`` sets the fine-tuning
    data module's ``packed_sequence_specs`` (``llm.gpt.data.PackedSequenceSpecs``). The
    packed row size is ``packed_sequence_size`` in both. The recipe must be a packed-SFT one
    (its ``*_specs`` object set, a THD attention on Transformer Engine); the names are
    checked against the pinned upstream tables (tests/fixtures/upstream)."""
    if not packed:
        return []
    if tool == "bridge":
        return [
            ("dataset.enable_offline_packing", True),
            ("dataset.offline_packing_specs.packed_sequence_size", seq_length),
        ]
    if tool == "nemo":
        return [("data.packed_sequence_specs.packed_sequence_size", seq_length)]
    raise ValueError(f"no packed-sequence settings for {tool!r}")


def dse_only(name: str, value: Any) -> str | None:
    """Why a knob value exists only in dse's built-in trainer (None when it does not)."""
    if name == "attention_backend" and value == "sdpa":
        return (
            "sdpa is dse's built-in trainer swapping torch SDPA into the local spec; "
            "Megatron-LM, Bridge and NeMo have no such attention backend (use flash/fused/te)"
        )
    return None
