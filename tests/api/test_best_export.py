"""``GET /studies/{name}/best``'s launcher exports: the same text as ``dse best --format``,
environment lines included; a best configuration a target cannot express is ``null`` with
``<format>_why`` in the JSON answer and a 422 naming the knob for ``?format=``."""

from __future__ import annotations

import json
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import yaml

from dse.cli.main import main
from dse.core.records import Outcome
from dse.space.searchspace import params_key, parse_space
from dse.storage import open_storage
from tests.api.conftest import make_client
from tests.conftest import EXAMPLES

V1 = "/api/v1"


def _study(tmp_path: Path, params: dict) -> str:
    """A database holding the CPU example with one complete trial of ``params``."""
    data = yaml.safe_load((EXAMPLES / "tiny_gpt_cpu.yaml").read_text())
    data["env"] = {"fixed": {"NCCL_DEBUG": "WARN"}}
    text = yaml.safe_dump(data)
    space = parse_space(data, "tiny")
    url = f"sqlite:///{tmp_path}/s.db"
    with open_storage(url) as st:
        rec = st.create_study(space_yaml=text, **space.study_fields())
        full = {**space.baseline(), **params}
        t = st.claim_trial(study_id=rec.id, params=full, params_key=params_key(full), budget=9)
        assert t is not None
        st.finish_trial(t.id, Outcome("ok", {"tflops_per_gpu": 1.0}), value=1.0)
    return url


def _cli(url: str, fmt: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["best", "--storage", url, "--format", fmt])
    return rc, out.getvalue(), err.getvalue()


def test_exports_carry_the_environment_as_the_cli_prints_them(tmp_path: Path) -> None:
    url = _study(tmp_path, {"micro_batch_size": 2})
    with make_client(url) as c:
        exports = c.get(f"{V1}/studies/tiny-gpt-cpu/best").json()["exports"]
        for fmt in ("megatron", "bridge", "nemo"):
            rc, out, _ = _cli(url, fmt)
            assert rc == 0 and out == exports[fmt] + "\n"
            assert exports[fmt].startswith("export NCCL_DEBUG=WARN\n")
            assert f"{fmt}_why" not in exports
            r = c.get(f"{V1}/studies/tiny-gpt-cpu/best", params={"format": fmt})
            assert r.status_code == 200 and r.text == out
    assert "--micro-batch-size 2" in exports["megatron"]


def test_a_best_no_target_can_express_is_refused_by_name(tmp_path: Path) -> None:
    url = _study(tmp_path, {"attention_backend": "sdpa"})  # dse's built-in trainer's own
    with make_client(url) as c:
        best = c.get(f"{V1}/studies/tiny-gpt-cpu/best").json()
        assert best["params"]["attention_backend"] == "sdpa"
        for fmt, title in (("megatron", "Megatron-LM"), ("bridge", "Megatron-Bridge"),
                           ("nemo", "NeMo")):  # fmt: skip
            assert best["exports"][fmt] is None
            why = best["exports"][f"{fmt}_why"]
            assert f"attention_backend='sdpa' has no {title} equivalent" in why
            assert "use flash/fused/te" in why  # the nearest upstream settings
            r = c.get(f"{V1}/studies/tiny-gpt-cpu/best", params={"format": fmt})
            assert r.status_code == 422 and r.json()["detail"] == why
            rc, out, err = _cli(url, fmt)
            assert rc == 1 and out == "" and why in err
    rc, out, _ = _cli(url, "json")
    assert rc == 0 and json.loads(out)["params"]["attention_backend"] == "sdpa"
