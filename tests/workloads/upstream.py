"""What the real tools accept, from the data files of ``tests/fixtures/upstream/`` (extracted
from each project's source at a pinned commit by ``scripts/extract_upstream_*.py``), and the
checks of a rendered trial against them.

The checks read only a launcher's public output (:class:`RenderedTrial`: its ``argv``), so
they hold whatever table or plugin renders it:

* Megatron-LM: every ``--flag`` after the script is a flag of Megatron-LM's parser; a switch
  has no value, a flag with a value has one, and a value of a flag with choices is one of them;
* Megatron-Bridge: every ``section.field=value`` names a ``ConfigContainer`` section and a
  field of a class that section holds;
* NeMo: every ``prefix.name=value`` under ``trainer`` (Lightning's ``Trainer``),
  ``trainer.strategy``, ``trainer.strategy.ddp``, ``model.config``, ``optim.config``,
  ``log`` or ``data`` names an argument or field of that object (the longest prefix
  decides); a key under none of them is returned as not checked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream"


@cache
def load(name: str) -> dict[str, Any]:
    """One data file (``megatron_lm_args``, ``bridge_config``, ``nemo_recipe``)."""
    data: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return data


def _after_entry(argv: Sequence[str], marker: str | None) -> list[str]:
    """The arguments after the entry point: the script (``*.py``), ``-m MODULE``, or
    ``marker`` (NeMo's ``-y``)."""
    items = list(argv)
    for i, a in enumerate(items):
        if marker is not None and a == marker:
            return items[i + 1 :]
        if marker is None and a.endswith(".py"):
            return items[i + 1 :]
        if (
            marker is None
            and a == "-m"
            and i + 1 < len(items)
            and "torch.distributed" not in items[i + 1]
        ):
            return items[i + 2 :]
    raise AssertionError(f"no entry point in {items}")


def megatron_lm_problems(argv: Sequence[str]) -> list[str]:
    """What Megatron-LM's parser would refuse in a rendered command line."""
    flags: dict[str, dict[str, Any]] = load("megatron_lm_args")["flags"]
    args = _after_entry(argv, None)
    # dse's own Megatron-LM entry point (python -m dse....) also takes dse's --dse-* flags
    own = any(a == "-m" and b.startswith("dse.") for a, b in zip(argv, argv[1:], strict=False))
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        i += 1
        if not a.startswith("--"):
            out.append(f"{a!r} is not a flag or the value of one")
            continue
        flag, eq, inline = a.partition("=")
        if own and flag.startswith("--dse-"):
            while not eq and i < len(args) and not args[i].startswith("--"):
                i += 1
            continue
        spec = flags.get(flag)
        values = [inline] if eq else []
        while not eq and i < len(args) and not args[i].startswith("--"):
            values.append(args[i])
            i += 1
        if spec is None:
            out.append(f"{flag}: Megatron-LM has no such flag")
            continue
        if not spec["takes_value"]:
            if values:
                out.append(f"{flag} is a switch; given {values}")
            continue
        if not values:
            out.append(f"{flag} needs a value")
        elif spec["choices"] is not None:
            bad = [v for v in values if v not in spec["choices"]]
            if bad:
                out.append(f"{flag} {bad}: not among Megatron-LM's choices {spec['choices']}")
    return out


def _assignments(args: Sequence[str]) -> list[str]:
    return [a.split("=", 1)[0].lstrip("+~") for a in args if "=" in a and not a.startswith("-")]


def bridge_problems(argv: Sequence[str]) -> list[str]:
    """What a Megatron-Bridge ``ConfigContainer`` has no place for in a rendered command."""
    sections: dict[str, dict[str, list[str]]] = load("bridge_config")["sections"]
    out = []
    for key in _assignments(_after_entry(argv, None)):
        section, _, rest = key.partition(".")
        if section not in sections:
            out.append(f"{key}: ConfigContainer has no section {section!r}")
            continue
        if not rest or not sections[section]:  # the whole section, or a mapping (env_vars)
            continue
        name = rest.split(".", 1)[0]
        if not any(name in fields for fields in sections[section].values()):
            classes = [c.split(":")[1] for c in sections[section]]
            out.append(f"{key}: no field {name!r} in {section} ({', '.join(classes)})")
    return out


def nemo_problems(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """(problems, keys not checked) of a rendered NeMo-Run command."""
    prefixes: dict[str, dict[str, list[str]]] = load("nemo_recipe")["prefixes"]
    out, unchecked = [], []
    for key in _assignments(_after_entry(argv, "-y")):
        owner = max((p for p in prefixes if key.startswith(p + ".")), key=len, default=None)
        if owner is None:
            unchecked.append(key)
            out.append(f"{key}: not an override path of a NeMo 2.0 recipe")
            continue
        name = key[len(owner) + 1 :]
        if not any(name in names for names in prefixes[owner].values()):
            classes = [c.split(":")[1] for c in prefixes[owner]]
            out.append(f"{key}: {', '.join(classes)} has no {name!r}")
    return out, unchecked


def problems(launcher: str, argv: Sequence[str]) -> list[str]:
    """The problems of one rendered trial of ``launcher`` (``bridge``, ``nemo``,
    ``megatron_lm``)."""
    if launcher == "megatron_lm":
        return megatron_lm_problems(argv)
    if launcher == "bridge":
        return bridge_problems(argv)
    if launcher == "nemo":
        return nemo_problems(argv)[0]
    raise ValueError(f"no upstream data for launcher {launcher!r}")
