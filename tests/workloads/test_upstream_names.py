"""Every flag and override dse renders exists in the real tool, at a pinned commit.

For each recipe launcher, every example space of it renders every value of every catalog
knob (on the example's baseline, and with the flex MoE dispatcher and selective recompute,
where more knobs take effect); a value the recipe cannot take is refused by name
(``NotTaken``), and everything rendered is checked against the data extracted from
Megatron-LM's argument parser, Megatron-Bridge's ``ConfigContainer`` and NeMo's recipe
objects (``tests/fixtures/upstream/``, written by ``scripts/extract_upstream_*.py``, which
a test re-runs where the upstream clones are at hand). A renamed flag fails here: the
mutation tests rename one in a rendered trial and expect the check to name it. The same
check reads what ``dse best --format megatron|bridge|nemo`` prints, for every example space.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dse.core.exceptions import NoEquivalentError, SpaceError
from dse.core.registry import REGISTRY
from dse.results.best_formats import EXPORT_TARGETS, render_best
from dse.space.knobs import FIELD_SOURCES, KNOBS, Knob, ModulesKnob
from dse.space.searchspace import SearchSpace, load_space
from dse.workloads.launchers import NotTaken, launcher_for
from dse.workloads.launchers.flags import export_text
from tests.workloads import upstream

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def _examples(launcher: str) -> list[SearchSpace]:
    out = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        space = load_space(path)
        if space.workload.name == launcher:
            out.append(space)
    return out


def _values(knob: Knob) -> list[Any]:
    if isinstance(knob, ModulesKnob):
        return [*knob.choices, ",".join(knob.choices[:2])]
    if knob.kind == "bool":
        return [False, True]
    if knob.kind == "choice":
        return list(knob.choices)
    return [None, 1, 2] if knob.default is None else [knob.default, 2]


def _renders(space: SearchSpace) -> Iterator[tuple[str, Any, list[str]]]:
    """(knob, value, argv) of every knob value that the space's recipe takes."""
    launcher = launcher_for(space)
    base = space.full_params(space.baseline())
    bases = [base, {**base, "moe_token_dispatcher_type": "flex", "recompute": "selective"}]
    for name, knob in KNOBS.items():
        for value in _values(knob):
            for b in bases:
                try:
                    yield name, value, launcher.render({**b, name: value}).argv
                except NotTaken:
                    continue  # refused by name: dse validate says why
                except SpaceError:
                    continue  # the example fixes this field in its own overrides


LAUNCHERS = REGISTRY.names("launcher")


def _documented_newer(problem: str) -> bool:
    """A field the knob catalog records as newer than the pinned releases
    (:data:`dse.space.knobs.FIELD_SOURCES`: where it is defined instead)."""
    return any(
        f"'{f}'" in problem or problem.startswith(f"--{f.replace('_', '-')}:")
        for f in FIELD_SOURCES
    )


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_rendered_name_exists_upstream(launcher: str) -> None:
    spaces = _examples(launcher)
    assert spaces, f"no example space runs the {launcher} launcher"
    found: dict[str, set[str]] = {}
    knobs_rendered: set[str] = set()
    n = 0
    for space in spaces:
        for name, value, argv in _renders(space):
            n += 1
            knobs_rendered.add(name)
            for p in upstream.problems(launcher, argv):
                if _documented_newer(p):
                    continue
                found.setdefault(p, set()).add(f"{space.study}: {name}={value!r}")
    assert not found, "\n".join(f"{p}  (from {sorted(w)[:3]})" for p, w in sorted(found.items()))
    assert n > len(KNOBS) and len(knobs_rendered) > len(KNOBS) // 2, (n, sorted(knobs_rendered))


def test_every_nemo_override_has_an_owner() -> None:
    """Each NeMo-Run override path lands under an object the data file knows (Lightning's
    Trainer included): none is left unchecked."""
    for space in _examples("nemo"):
        for name, value, argv in _renders(space):
            assert upstream.nemo_problems(argv)[1] == [], (name, value)


# --- the check fails on a name the tool lacks ------------------------------------------------

#: One knob value per launcher, a name it renders, and a misspelling of that name.
MUTATIONS = {
    "megatron_lm": ("sequence_parallel", True, "--sequence-parallel", "--sequence-paralel"),
    "bridge": ("sequence_parallel", True, "model.sequence_parallel=", "model.sequence_paralel="),
    "nemo": (
        "sequence_parallel", True, "trainer.strategy.sequence_parallel=",
        "trainer.strategy.sequence_paralel=",
    ),
}  # fmt: skip


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_renamed_flag_fails_the_check(launcher: str, monkeypatch: pytest.MonkeyPatch) -> None:
    knob, value, real, wrong = MUTATIONS[launcher]
    space = _examples(launcher)[0]
    cls = type(launcher_for(space))
    render = cls.render

    def renamed(self: Any, params: Any, **kw: Any) -> Any:
        r = render(self, params, **kw)
        object.__setattr__(r, "argv", [a.replace(real, wrong, 1) for a in r.argv])
        return r

    monkeypatch.setattr(cls, "render", renamed)
    params = {**space.full_params(space.baseline()), knob: value}
    argv = launcher_for(space).render(params).argv
    assert any(wrong in a for a in argv), argv
    found = upstream.problems(launcher, argv)
    assert any(wrong.rstrip("=").split(".")[-1] in p for p in found), found


def test_a_switch_with_a_value_and_a_bad_choice_fail_the_megatron_lm_check() -> None:
    head = ["torchrun", "--standalone", "pretrain_gpt.py"]
    assert (
        upstream.megatron_lm_problems(
            [*head, "--sequence-parallel", "--use-distributed-optimizer"]
        )
        == []
    )
    assert "is a switch" in upstream.megatron_lm_problems([*head, "--sequence-parallel", "1"])[0]
    bad = upstream.megatron_lm_problems([*head, "--moe-token-dispatcher-type", "alltoall_seq"])
    assert "not among Megatron-LM's choices" in bad[0]
    assert "needs a value" in upstream.megatron_lm_problems([*head, "--micro-batch-size"])[0]


# --- the data files are what the scripts extract ---------------------------------------------


def _git_dir(env: str) -> Path | None:
    path = os.environ.get(env)
    return Path(path) if path and Path(path).exists() else None


@pytest.mark.parametrize(
    ("script", "data", "repos"),
    [
        ("extract_upstream_megatron_lm.py", "megatron_lm_args", {"--repo": "DSE_MEGATRON_LM_GIT"}),
        (
            "extract_upstream_bridge.py", "bridge_config",
            {"--repo": "DSE_MEGATRON_BRIDGE_GIT", "--megatron-repo": "DSE_MEGATRON_LM_GIT"},
        ),
        (
            "extract_upstream_nemo.py", "nemo_recipe",
            {"--repo": "DSE_NEMO_GIT", "--megatron-repo": "DSE_MEGATRON_LM_GIT",
             "--lightning-repo": "DSE_LIGHTNING_GIT"},
        ),
    ],
)  # fmt: skip
def test_the_data_files_are_what_the_scripts_extract(
    tmp_path: Path, script: str, data: str, repos: dict[str, str]
) -> None:
    """Re-extracts a data file from the upstream clones named by environment variables
    (skipped where they are not set: the clones are not part of this repository)."""
    args: list[str] = []
    for flag, env in repos.items():
        git_dir = _git_dir(env)
        if git_dir is None:
            pytest.skip(f"${env} (a git directory of the upstream clone) is not set")
        args += [flag, str(git_dir)]
    stored = upstream.load(data)
    args += ["--commit", stored["commit"]]
    if script == "extract_upstream_nemo.py":
        args += ["--megatron-commit", stored["megatron_lm_commit"]]
        args += ["--lightning-commit", stored["lightning_commit"]]
    out = tmp_path / f"{data}.json"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / script), *args, "-o", str(out)], check=True
    )
    assert out.read_text() == (upstream.FIXTURES / f"{data}.json").read_text()


# --- the `dse best` export: the same check ---------------------------------------------------

#: An entry point before an export's arguments (the checks read what follows it).
_EXPORT_HEAD = {
    "megatron_lm": ["torchrun", "pretrain_gpt.py"],
    "bridge": ["torchrun", "run_recipe.py"],
    "nemo": ["nemo", "llm", "pretrain", "--factory", "recipe", "-y"],
}


@pytest.mark.parametrize("fmt", sorted(EXPORT_TARGETS))
def test_every_dse_best_export_name_exists_upstream(fmt: str) -> None:
    """What ``dse best --format`` prints (``render_best`` with the targets' own renderer) for
    every value of every catalog knob on every example space, whatever its workload: each
    flag or override exists upstream, or the export refuses the value naming its knob."""
    target = EXPORT_TARGETS[fmt]
    found: dict[str, set[str]] = {}
    n = refused = 0
    for path in sorted(EXAMPLES.glob("*.yaml")):
        space = load_space(path)
        base = space.full_params(space.baseline())
        bases = [base, {**base, "moe_token_dispatcher_type": "flex", "recompute": "selective"}]
        for name, knob in KNOBS.items():
            for value in _values(knob):
                for b in bases:
                    params = {**b, name: value}
                    try:
                        text = render_best({"params": params}, fmt, space, export_text)
                    except NoEquivalentError as e:
                        assert e.knob in params and e.why, str(e)  # refused by name
                        refused += 1
                        continue
                    n += 1
                    *env, args = text.split("\n")
                    assert all(line.startswith("export ") for line in env), text
                    argv = [*_EXPORT_HEAD[target], *shlex.split(args)]
                    for p in upstream.problems(target, argv):
                        if not _documented_newer(p):
                            found.setdefault(p, set()).add(f"{space.study}: {name}={value!r}")
    assert not found, "\n".join(f"{p}  (from {sorted(w)[:3]})" for p, w in sorted(found.items()))
    assert n > len(KNOBS), (n, refused)
