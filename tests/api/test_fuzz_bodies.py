"""Fuzz: hostile bodies of ``POST /studies`` (mutated space files, hostile constraints, YAML
tricks, bytes that are not UTF-8) answer 201, 409 or 422 naming the field; never a 5xx. The
same for the JSON bodies of ``POST /best/query`` (200, 404 or 422 naming the body).

Also the review's specific bodies: the alias chain in ``runner.options`` that aborted the
server, and constraint arithmetic that stalled it."""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.api.conftest import TOKEN, TestClient, make_client
from tests.hostile import TINY_TEXT, assert_clean_message, hostile_values, space_bytes

V1 = "/api/v1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
YAML = {"Content-Type": "application/yaml"}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with tempfile.TemporaryDirectory(prefix="dse-fuzz-api-") as d:
        url = f"sqlite:///{Path(d) / ('fuzz-' + uuid.uuid4().hex[:8] + '.db')}"
        with make_client(url) as c:
            yield c


def _post(client: TestClient, body: bytes) -> tuple[int, str]:
    r = client.post(f"{V1}/studies", headers={**AUTH, **YAML}, content=body)
    assert r.status_code in (201, 409, 422), (r.status_code, r.text)
    detail = r.json().get("detail", "") if r.status_code != 201 else ""
    if r.status_code == 422:
        assert isinstance(detail, str), detail
        assert_clean_message(detail, "request body")
    return r.status_code, detail


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(body=space_bytes())
def test_post_studies_fuzz(client: TestClient, body: bytes) -> None:
    _post(client, body)


def _bomb() -> bytes:
    lines = ["    a0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    for i in range(1, 10):
        lines.append(f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    runner = "runner: {name: local, max_parallel: 1, workdir: dse_runs}\n"
    text = TINY_TEXT.replace(runner, "runner:\n  options:\n" + "\n".join(lines) + "\n")
    return text.replace("study: tiny-gpt-cpu", "study: bomb").encode()


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (_bomb(), "expands to more than"),
        (TINY_TEXT.encode() + b'constraints: ["7**10**6 > 0"]\n', "'**' result too large"),
        (TINY_TEXT.encode() + b'constraints: ["9**9**9**9 > 0"]\n', "'**' result too large"),
        (TINY_TEXT.encode() + b'constraints: ["1 / (dp - dp) > 0"]\n', "division by zero"),
        (TINY_TEXT.replace("seed: 0", "seed: " + "9" * 5000).encode(), "5000 characters"),
        (
            TINY_TEXT.replace(
                "micro_batch_size: {values: [1, 2, 4], baseline: 1}",
                "micro_batch_size: {type: int, low: 1, high: 1000000000000}",
            ).encode(),
            "knobs.micro_batch_size.domain.high",
        ),
    ],
    ids=["alias-bomb", "pow", "pow-tower", "zero-division", "long-int", "int-range"],
)
def test_review_bodies_answer_422(client: TestClient, body: bytes, words: str) -> None:
    status, detail = _post(client, body)
    assert status == 422
    assert words in detail


_QUERY_KEYS = st.sampled_from(["model", "semantics", "hardware", "metric", "num_layers", "gpu"])


@st.composite
def best_query_bodies(draw: st.DrawFn) -> bytes:
    """``POST /best/query`` bodies: hostile JSON values under the query's keys, or text that
    JSON parsers choke on (huge integers, deep nesting, bytes that are not UTF-8)."""
    doc = draw(st.dictionaries(_QUERY_KEYS, hostile_values, max_size=4))
    if draw(st.booleans()):
        doc["model"] = draw(st.dictionaries(st.sampled_from(["num_layers", "hidden_size", "x"]),
                                            hostile_values, max_size=3))  # fmt: skip
    text = json.dumps(doc, allow_nan=True).encode()
    edit = draw(st.integers(0, 5))
    if edit == 0:
        text = text.replace(b"}", b', "big": ' + b"9" * draw(st.integers(4300, 6000)) + b"}", 1)
    elif edit == 1:
        depth = draw(st.integers(100, 5000))
        text = b'{"model": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"
    elif edit == 2:
        text = text[: draw(st.integers(0, len(text)))] + draw(st.binary(min_size=1, max_size=8))
    return text


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(body=best_query_bodies())
def test_best_query_fuzz(client: TestClient, body: bytes) -> None:
    """No 5xx, no bare 400: an answer, 404 (nothing matches) or 422 naming the body part."""
    r = client.post(f"{V1}/best/query", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code in (200, 404, 422), (r.status_code, r.text)
    if r.status_code == 422:
        detail = r.json()["detail"]
        assert isinstance(detail, str), detail
        if not detail.startswith("give at least one model, semantics or hardware field"):
            assert_clean_message(detail, "body")


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"model": {"num_layers": ' + b"9" * 5000 + b"}}", "an integer has too many digits"),
        (b'{"model": ' + b'{"a": ' * 3000 + b"1" + b"}" * 3001, "nested too deeply"),
    ],
    ids=["long-int", "deep"],
)
def test_best_query_unreadable_json_is_422(client: TestClient, body: bytes, words: str) -> None:
    r = client.post(f"{V1}/best/query", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"] == f"body: not valid JSON ({words})"
