"""The runner contract, on real child processes: a finished trial is polled once with its
outcome, an exit without a result is a classified failure, a timeout or a hang kills the
whole process group, stop() kills and returns every running trial, GPU slots are handed out
and given back, and a command that cannot start is a TrialLaunchError (never an OSError).
Parametrized over the runners that run processes (add a new one to RUNNERS)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dse.core.exceptions import TrialLaunchError
from dse.runners import BaseRunner, Finished, Launch, LocalRunner

RUNNERS: dict[str, Callable[..., BaseRunner]] = {
    "local": lambda **kw: LocalRunner(device="cpu", world_size=1, **kw),
}


@pytest.fixture(params=sorted(RUNNERS))
def make(request: pytest.FixtureRequest) -> Callable[..., BaseRunner]:
    return RUNNERS[request.param]


def _launch(
    tmp_path: Path, tid: int, script: str, world_size: int = 1, device: str = "cpu",
    **kw: float,
) -> Launch:  # fmt: skip
    d = tmp_path / f"t{tid}"
    return Launch(trial_id=tid, number=tid, argv=["sh", "-c", script], trial_dir=d,
                  metrics_path=d / "metrics.jsonl", log_path=d / "log.txt",
                  world_size=world_size, device=device, **kw)  # fmt: skip


def _wait(r: BaseRunner, timeout: float = 30.0) -> list[Finished]:
    out: list[Finished] = []
    deadline = time.monotonic() + timeout
    while r.running() and time.monotonic() < deadline:
        out += r.poll()
        time.sleep(0.05)
    return out + r.poll()


def _gone(pgid: int) -> bool:
    """No live process in the group (zombies of reparented children do not count: where
    pid 1 does not reap them they stay listed)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return False
    return True


def _pgid(tmp_path: Path, tid: int) -> int:
    import json

    return int(json.loads((tmp_path / f"t{tid}" / "pgid").read_text())["pgid"])


def test_exit_with_a_result(tmp_path: Path, make: Callable[..., BaseRunner]) -> None:
    r = make()
    line = '{"type": "summary", "tflops_per_gpu": 10.0, "step_time_s": 1.0, "peak_mem_gib": 2.0}'
    r.submit(_launch(tmp_path, 1, f"sleep 0.2; echo '{line}' > metrics.jsonl"))
    assert r.free_slots() == 0 and r.running() == [1]
    (fin,) = _wait(r)
    assert fin.trial_id == 1 and fin.outcome.ok and fin.outcome.metrics["tflops_per_gpu"] == 10
    assert r.poll() == [] and r.free_slots() == 1


def test_exit_3_without_a_result(tmp_path: Path, make: Callable[..., BaseRunner]) -> None:
    r = make()
    r.submit(_launch(tmp_path, 1, "echo 'torch.OutOfMemoryError: CUDA out of memory'; exit 3"))
    (fin,) = _wait(r)
    assert fin.outcome.failure_class == "oom"
    assert "exited with code 3" in (fin.outcome.reason or "")


def test_timeout_kills_a_busy_child(tmp_path: Path, make: Callable[..., BaseRunner]) -> None:
    r = make()
    # the trial's own child spins; the whole group must go
    r.submit(_launch(tmp_path, 1, "yes > /dev/null & sleep 60", timeout_s=1.0))
    pgid = _pgid(tmp_path, 1)
    (fin,) = _wait(r)
    assert fin.outcome.failure_class == "timeout"
    deadline = time.monotonic() + 10
    while not _gone(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(pgid)


def test_hang_timeout(tmp_path: Path, make: Callable[..., BaseRunner]) -> None:
    r = make()
    r.submit(_launch(tmp_path, 1, "sleep 60", hang_timeout_s=0.5))
    (fin,) = _wait(r)
    assert fin.outcome.failure_class == "hang"


def test_stop_kills_every_running_trial(tmp_path: Path, make: Callable[..., BaseRunner]) -> None:
    r = make(max_parallel=2)
    r.submit(_launch(tmp_path, 1, "sleep 60"))
    r.submit(_launch(tmp_path, 2, "yes > /dev/null & sleep 60"))
    pgids = [_pgid(tmp_path, 1), _pgid(tmp_path, 2)]
    assert sorted(r.stop()) == [1, 2]
    assert r.running() == [] and r.free_slots() == 2
    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously
    while not all(_gone(p) for p in pgids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pgids)


def test_launch_error_is_wrapped(tmp_path: Path, make: Callable[..., BaseRunner]) -> None:
    r = make()
    d = tmp_path / "t1"
    bad = Launch(trial_id=1, number=0, argv=[str(tmp_path / "no-such-python"), "x"],
                 trial_dir=d, metrics_path=d / "m", log_path=d / "log", world_size=1,
                 device="cpu")  # fmt: skip
    with pytest.raises(TrialLaunchError, match="cannot start"):
        r.submit(bad)
    assert r.free_slots() == 1 and r.running() == []


def test_gpu_slots(tmp_path: Path) -> None:
    r = LocalRunner(device="cuda", world_size=2, gpus=[0, 1, 2, 3])
    assert r.free_slots() == 2
    for tid in (1, 2):
        script = "echo $CUDA_VISIBLE_DEVICES > gpus.txt; sleep 0.3"
        r.submit(_launch(tmp_path, tid, script, world_size=2, device="cuda"))
    assert r.free_slots() == 0
    fins = _wait(r)
    assert sorted(f.trial_id for f in fins) == [1, 2] and all(f.devices == 2 for f in fins)
    seen = sorted((tmp_path / f"t{t}" / "gpus.txt").read_text().strip() for t in (1, 2))
    assert seen == ["0,1", "2,3"]
    assert r.free_slots() == 2
    with pytest.raises(TrialLaunchError, match="needs 2 GPU"):
        LocalRunner(device="cuda", world_size=2, gpus=[0])
