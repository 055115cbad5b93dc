"""Size limits on what dse reads from outside (space files, constraints, imported studies).

Every limit lives here, so that the parser, the validators and the documentation agree. The
limits are far above what a real recipe needs and far below what makes parsing, validation or
the space check slow: a file that passes them is validated in well under a second.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

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
    "MAX_DURATION_S",
    "MAX_EXPORT_BYTES",
    "MAX_TABLE_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_ABS_VALUE",
    "printable",
    "one_line",
    "read_regular_file",
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
#: Seconds of any duration a space sets (a trial's timeout and hang timeout, the study's wall
#: clock, a runner's queue timeout): 30 days. A trial's Slurm ``--time`` is its timeout plus
#: 2 minutes, so it stays a time limit Slurm reads (1e300 s would be a 300-digit one).
MAX_DURATION_S = 30 * 86400
#: An imported study file larger than this is refused before it is parsed.
MAX_EXPORT_BYTES = 1 << 30
#: A measured (replay) table larger than this is refused before it is read: a row is under
#: 1 KiB, so this holds a quarter of a million measured configurations.
MAX_TABLE_BYTES = 256 << 20
#: Nesting of an imported JSON document.
MAX_JSON_DEPTH = 32
#: Largest magnitude of an imported trial value or metric (a TFLOP/s, a step time, GiB).
MAX_ABS_VALUE = 1e15

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters (ESC, NUL, ...) escaped, newlines and tabs kept:
    a message that quotes its input cannot move the cursor or recolour a terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def one_line(text: str) -> str:
    """``text`` safe to print or write on one line: what is not printable (controls, C1
    included; line and paragraph separators; invisible formatting characters) escaped as in
    ``repr``."""
    if text.isprintable():
        return text
    return repr(text)[1:-1]


def read_regular_file(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them.

    A device (``/dev/zero``: endless), a FIFO (whose reader waits for a writer), a folder or
    a socket is refused before anything is read, and so is a file of more than ``limit``
    bytes, or one that grows past it while it is read.

    Raises:
        OSError: the file cannot be opened or read (``strerror`` says why).
        ValueError: not a regular file, or larger than ``limit`` (the message says which,
            without the path: the caller names the file and what it is for).
    """
    # O_NONBLOCK: opening a FIFO does not wait for a writer, so it can be refused
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"not a regular file (a {_file_kind(st.st_mode)})")
        if st.st_size > limit:
            raise ValueError(f"{st.st_size} bytes, more than the {limit} read")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"more than the {limit} bytes read (it grew while read)")
    return data


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "folder"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
    )
    return next((name for test, name in kinds if test(mode)), "special file")
