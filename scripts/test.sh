#!/usr/bin/env bash
# Installs dse with every extra into .venv and runs the checks CI runs: ruff, mypy,
# import-linter (the layer contracts of pyproject.toml), pytest on two workers with line and
# branch coverage (printed at the end; DSE_COVERAGE=0 runs without it, DSE_TEST_WORKERS=0 in
# one process). Arguments go to pytest.
#
# On a fresh Debian machine as root it first installs and starts what the tests use:
# python3-venv, PostgreSQL with a test role of its own (scripts/pg_up.sh; the tests never log
# in as `postgres`), Debian's Chromium for the dashboard tests, a one-node Slurm
# (scripts/slurm_up.sh, stopped when the checks end). Without root these must be there
# already: a test that needs a missing one is skipped naming it, and fails under CI=true.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
ROOT=0
[ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && ROOT=1

# --- system packages (root with apt-get: one update, one install) ----------------------------
need=()
if [ ! -x .venv/bin/python ] && ! "$PY" -c "import ensurepip, venv" 2>/dev/null; then
  need+=(python3-venv)
fi
command -v pg_ctlcluster >/dev/null 2>&1 || need+=(postgresql)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$ROOT" = 1 ]; then
    echo "scripts/test.sh: installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "warning: missing ${need[*]} (installing them needs root and apt-get)" >&2
  fi
fi

# --- the virtual environment -----------------------------------------------------------------
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/pip install -q --upgrade pip >/dev/null
.venv/bin/pip install -q "torch==2.13.0"
.venv/bin/pip install -q -e ".[megatron,postgres,api,dev]"

# --- PostgreSQL on 127.0.0.1:5432 and the tests' role (DSE_TEST_PG names another server) ------
if [ -z "${DSE_TEST_PG:-}" ]; then
  scripts/pg_up.sh || echo "warning: PostgreSQL is not ready; the PostgreSQL tests will not run" >&2
  eval "$(scripts/pg_up.sh env)"
fi

# --- a one-node Slurm (munge, slurmctld, slurmd; private config) for the Slurm runner's tests --
if [ "$(id -u)" = 0 ]; then
  scripts/slurm_up.sh || echo "warning: Slurm did not start; the slurm tests will not run" >&2
  eval "$(scripts/slurm_up.sh env)"
  trap 'scripts/slurm_up.sh stop' EXIT
fi

.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/python scripts/typecheck.py
.venv/bin/python scripts/lint_imports.py
cov=(--cov --cov-report=term)
[ "${DSE_COVERAGE:-1}" = 0 ] && cov=()
# two workers (pytest-xdist): most of the suite waits on subprocesses, servers and queues;
# a test file stays on one worker, the Slurm tests on one, the Ray tests on one
# (tests/conftest.py). DSE_TEST_WORKERS=0 runs it in one process. The 25 slowest tests are
# listed at the end (--durations=25).
par=(-n "${DSE_TEST_WORKERS:-2}" --dist loadgroup)
[ "${DSE_TEST_WORKERS:-2}" = 0 ] && par=()
.venv/bin/python -m pytest -q --durations=25 "${par[@]}" "${cov[@]}" "$@"
