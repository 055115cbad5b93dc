"""Property-based API tests: schemathesis generates requests from the app's OpenAPI schema
(valid and invalid ones); every answer must be a documented status, match its schema, and
never be a server error. Runs in-process (ASGI) against a seeded SQLite database."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, settings

from dse.api import Settings, create_app
from dse.storage import open_storage
from tests.api.conftest import TOKEN
from tests.api.seed import seed_all

_DIR = tempfile.TemporaryDirectory(prefix="dse-fuzz-")
_URL = f"sqlite:///{Path(_DIR.name) / 'fuzz.db'}"
_storage = open_storage(_URL)
seed_all(_storage)
_storage.close()
schema = schemathesis.openapi.from_asgi(
    "/api/v1/openapi.json", create_app(settings=Settings(storage=_URL, api_token=TOKEN))
)


#: Operations whose input has rules beyond its schema (a space file is YAML text that must
#: validate as a space; a cross-study query needs at least one field; a comparison names two
#: existing studies of one model; loss curves name existing trials): a schema-valid request
#: may rightly answer 422 there.
SEMANTIC_422 = {
    ("POST", "/api/v1/studies"),
    ("GET", "/api/v1/best"),
    ("POST", "/api/v1/best/query"),
    ("GET", "/api/v1/compare"),
    ("GET", "/api/v1/studies/{name}/losses"),
}


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case: Any) -> None:
    excluded = []
    if (case.method.upper(), case.path) in SEMANTIC_422:
        excluded.append(schemathesis.checks.positive_data_acceptance)
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"}, excluded_checks=excluded)
