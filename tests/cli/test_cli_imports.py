"""The CLI starts without the heavy stacks: importing dse.cli.main (and with it the study loop,
the agents' interface and the runners) loads no Optuna, SQLAlchemy, numpy, torch or FastAPI;
they load when a command needs them."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("optuna", "sqlalchemy", "alembic", "numpy", "torch", "megatron", "fastapi", "ray")


def test_importing_the_cli_loads_no_heavy_stack() -> None:
    code = (
        "import sys, dse.cli.main, dse.loop.study, dse.agents, dse.loop.proposer\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == ""


def test_python_dash_m_dse_runs_the_command() -> None:
    """``python -m dse`` is the ``dse`` command (dse/__main__.py)."""
    out = subprocess.run(
        [sys.executable, "-m", "dse", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("usage: dse ") and "validate" in out and "serve" in out
