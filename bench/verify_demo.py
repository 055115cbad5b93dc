"""``dse verify`` on the README's demo study: its table and stored result as files.

    python bench/verify_demo.py --storage sqlite:///dse.db --steps 100 \
        --out docs/results/verify

Runs ``dse verify --study demo-cpu`` (the study made by ``dse start --space
examples/demo_cpu.yaml``) on the given storage and writes ``demo_cpu.txt`` (the table as
printed) and ``demo_cpu.json`` (the stored result). Every figure is measured: one CPU rank of
the built-in Megatron-Core trainer, step times by the space's clock.
"""

from __future__ import annotations

import argparse
import json
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

from dse.cli.main import main as dse_main
from dse.core.records import VERIFY_ATTR
from dse.storage import open_storage


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", required=True)
    parser.add_argument("--study", default="demo-cpu")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", type=Path, default=Path("docs/results/verify"))
    args = parser.parse_args()
    text = StringIO()
    with redirect_stdout(text):
        rc = dse_main(["verify", "--study", args.study, "--steps", str(args.steps),
                       "--storage", args.storage])  # fmt: skip
    print(text.getvalue(), end="")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "demo_cpu.txt").write_text(text.getvalue())
    with open_storage(args.storage) as st:
        rec = st.get_study(args.study)
        stored = st.get_study_attrs(rec.id)[VERIFY_ATTR]
    (args.out / "demo_cpu.json").write_text(json.dumps(stored, indent=1) + "\n")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
