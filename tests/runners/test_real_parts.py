"""Every real part the README promises is here, one test each: PostgreSQL, Slurm, Ray, Chromium,
Megatron-Core on CPU. Without one the test is skipped naming it; under ``CI`` it fails naming
it (tests/conftest.py ``require_part``), and so does every test that needs it. Shown here: a
CI run with Slurm unavailable (no test Slurm, not root) fails naming Slurm, the same run
without ``CI`` skips naming Slurm, and the rule holds for each part."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

import tests.conftest as root_conftest
from tests.api.live import chromium
from tests.conftest import REPO, require_megatron, require_part

#: The first real-Slurm test (it needs the ``slurm`` fixture and nothing else first).
SLURM_TEST = "tests/runners/test_slurm_real.py::test_trial_completes_and_records_its_node"


def test_postgresql_is_here(pg_admin: Engine) -> None:
    with pg_admin.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar() == 1


@pytest.mark.slurm
def test_slurm_is_here(slurm: str) -> None:
    r = subprocess.run(["sinfo", "-h", "-n", slurm, "-o", "%T"], capture_output=True, text=True)
    assert r.stdout.strip() in ("idle", "mixed", "allocated"), r.stdout + r.stderr


@pytest.mark.ray
def test_ray_is_here(ray_cluster: None) -> None:
    import ray

    assert ray.cluster_resources().get("GPU") == 4


@pytest.mark.slow
def test_chromium_is_here() -> None:
    with chromium() as browser:
        page = browser.new_page()
        page.set_content("<p id=x>here</p>")
        assert page.inner_text("#x") == "here"


def test_megatron_core_is_here() -> None:
    require_megatron()
    # the version the megatron extra pins (importing it here would warn: no TE, no Apex)
    assert metadata.version("megatron-core") == "0.16.1"


# --- the rule itself -----------------------------------------------------------------------


def _pytest_without_slurm(ci: str | None) -> subprocess.CompletedProcess[str]:
    """A real-Slurm test run where Slurm is unavailable: no test Slurm at its folder, and
    not root (as root here, the run drops to the ``nobody`` user)."""
    # under a folder every user may enter (TMPDIR may be private to root)
    base = tempfile.gettempdir()
    if any(not (os.stat(p).st_mode & 0o001) for p in (Path(base), *Path(base).parents)):
        base = "/tmp"
    with tempfile.TemporaryDirectory(prefix="dse-no-slurm-", dir=base) as tmp:
        Path(tmp).chmod(0o777)  # the user the probe runs as writes here
        env = {k: v for k, v in os.environ.items() if k not in ("CI", "SLURM_CONF")}
        env |= {"DSE_SLURM_DIR": f"{tmp}/slurm", "HOME": tmp}
        if ci is not None:
            env["CI"] = ci
        argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                "--basetemp", f"{tmp}/base", SLURM_TEST]  # fmt: skip
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            assert setpriv, "setpriv (util-linux) is needed to run the probe as a user"
            argv = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv]
        return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_ci_with_slurm_unavailable_fails_naming_slurm() -> None:
    r = _pytest_without_slurm(ci="true")
    out = r.stdout + r.stderr
    assert r.returncode == 1, out  # tests failed (not 0: passed or skipped)
    assert "1 error" in out or "1 failed" in out, out
    assert "Slurm is not available" in out and "CI is set: the Slurm tests must run" in out, out


def test_without_ci_slurm_unavailable_is_a_skip_naming_slurm() -> None:
    r = _pytest_without_slurm(ci=None)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "1 skipped" in out and "Slurm is not available" in out, out


@pytest.mark.parametrize("value", ["true", "1", "yes", "TRUE"])
def test_require_part_fails_under_ci(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.fail.Exception, match="^Ray is not available: gone .*CI is set"):
        require_part("Ray", "gone")


@pytest.mark.parametrize("value", [None, "", "0", "false", "no"])
def test_require_part_skips_without_ci(monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    with pytest.raises(pytest.skip.Exception, match="^Chromium is not available: gone$"):
        require_part("Chromium", "gone")


def test_ci_without_megatron_core_fails_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer, loss-parity, hybrid and host-jitter tests (``needs_megatron`` /
    ``require_megatron``) fail under CI when Megatron-Core cannot be imported."""
    real = root_conftest._find_spec
    monkeypatch.setattr(
        root_conftest, "_find_spec", lambda m: None if m.startswith("megatron") else real(m)
    )
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="Megatron-Core is not available: megatron"):
        require_megatron()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="Megatron-Core is not available"):
        require_megatron()


def test_property_tests_have_no_wall_time_deadline() -> None:
    """Hypothesis's default 200 ms per example fails property tests on a loaded machine;
    the loaded profile (tests/conftest.py) has none, in CI and locally."""
    from hypothesis import settings

    assert settings().deadline is None


def test_the_tests_default_server_is_the_role_pg_up_creates() -> None:
    """tests/conftest.py's default PostgreSQL URL is the role and password scripts/pg_up.sh
    creates (``env`` prints it): scripts/test.sh and a plain pytest run log in alike."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSE_TEST_PG")}
    r = subprocess.run(["bash", str(REPO / "scripts" / "pg_up.sh"), "env"], env=env,
                       capture_output=True, text=True, check=True)  # fmt: skip
    assert r.stdout.strip() == (
        "export DSE_TEST_PG=postgresql+psycopg://dse_test:dse_test@127.0.0.1:5432"
    )
    default = root_conftest.PG_SERVER if "DSE_TEST_PG" not in os.environ else None
    if default is not None:
        assert r.stdout.strip().split("=", 1)[1] == default
    bad = subprocess.run(["bash", str(REPO / "scripts" / "pg_up.sh"), "env"],
                         env={**env, "DSE_TEST_PG_ROLE": "x'; DROP ROLE postgres; --"},
                         capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "letters, digits or _" in bad.stderr
