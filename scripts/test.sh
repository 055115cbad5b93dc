#!/usr/bin/env bash
# Installs dse with every extra into .venv and runs the checks CI runs: ruff, mypy,
# import-linter (the layer contracts of pyproject.toml), pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q "torch==2.13.0"
.venv/bin/pip install -q -e ".[megatron,postgres,api,dev]"
# Debian's Chromium for the dashboard browser tests (Playwright drives it; no browser download)
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "warning: chromium not installed"
fi
# PostgreSQL on 127.0.0.1:5432 for the storage and API tests
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
fi
# A one-node Slurm (munge, slurmctld, slurmd; private config) for the Slurm runner's tests;
# stopped when the checks end
if [ "$(id -u)" = 0 ]; then
  scripts/slurm_up.sh || echo "warning: Slurm did not start; the slurm tests will fail"
  eval "$(scripts/slurm_up.sh env)"
  trap 'scripts/slurm_up.sh stop' EXIT
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python scripts/typecheck.py
.venv/bin/python scripts/lint_imports.py
.venv/bin/python -m pytest -q "$@"
