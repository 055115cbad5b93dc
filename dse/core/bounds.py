"""Size limits on what dse reads from outside (space files, constraints, imported studies).

Every limit lives here, so that the parser, the validators and the documentation agree. The
limits are far above what a real recipe needs and far below what makes parsing, validation or
the space check slow: a file that passes them is validated in well under a second.
"""

from __future__ import annotations

import re

__all__ = [
    "MAX_SPACE_BYTES",
    "MAX_YAML_NODES",
    "MAX_YAML_ALIASES",
    "MAX_YAML_DEPTH",
    "MAX_SCALAR_CHARS",
    "MAX_NAME_CHARS",
    "MAX_PATH_CHARS",
    "MAX_LIST_ITEMS",
    "MAX_KNOBS",
    "MAX_DOMAIN_VALUES",
    "MAX_CONSTRAINTS",
    "MAX_CONSTRAINT_CHARS",
    "MAX_CONSTRAINT_NODES",
    "MAX_INT_BITS",
    "MAX_EXPONENT",
    "MAX_SPACE_COMBINATIONS",
    "MAX_MODEL_INT",
    "MAX_SEED",
    "MAX_EXPORT_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_ABS_VALUE",
    "printable",
]

#: A space file larger than this is refused before it is parsed.
MAX_SPACE_BYTES = 1 << 20
#: YAML nodes after aliases are expanded (the file as the validator sees it).
MAX_YAML_NODES = 50_000
#: Alias uses (``*name``) in one document.
MAX_YAML_ALIASES = 100
#: Nesting of YAML collections.
MAX_YAML_DEPTH = 32
#: Characters of one YAML scalar that becomes a number (an int of 4,300 digits is refused
#: by Python itself; 40 characters hold any 128-bit integer and any float).
MAX_SCALAR_CHARS = 40
#: Characters of a name (study, recipe, GPU, runner option).
MAX_NAME_CHARS = 256
#: Characters of a path or URL.
MAX_PATH_CHARS = 4096
#: Items of a list field (choice values, features, GPU ids, warm-start configurations).
MAX_LIST_ITEMS = 1024
#: Knobs (and fixed knobs) of a space, environment knobs included.
MAX_KNOBS = 256
#: Values of one knob's domain (an int range is counted before it is built).
MAX_DOMAIN_VALUES = 4096
#: Constraints of a space and characters / syntax nodes of one constraint.
MAX_CONSTRAINTS = 64
MAX_CONSTRAINT_CHARS = 1000
MAX_CONSTRAINT_NODES = 200
#: Integers a constraint computes with, and the largest exponent of ``**``.
MAX_INT_BITS = 256
MAX_EXPONENT = 256
#: Raw knob combinations the space check looks at: every one of a space up to this size,
#: else a random sample of this many (a few seconds of rules: ``dse validate``, the grid count
#: of ``dse status`` and the API, the API's check of a posted space file).
MAX_SPACE_COMBINATIONS = 10_000
#: Architecture and batch integers (a signed 32-bit int, as Megatron's argument parser has).
MAX_MODEL_INT = 2**31 - 1
#: Seeds (NumPy's and Optuna's seeds are unsigned 32-bit).
MAX_SEED = 2**32 - 1
#: An imported study file larger than this is refused before it is parsed.
MAX_EXPORT_BYTES = 1 << 30
#: Nesting of an imported JSON document.
MAX_JSON_DEPTH = 32
#: Largest magnitude of an imported trial value or metric (a TFLOP/s, a step time, GiB).
MAX_ABS_VALUE = 1e15

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters (ESC, NUL, ...) escaped, newlines and tabs kept:
    a message that quotes its input cannot move the cursor or recolour a terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
