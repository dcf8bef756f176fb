"""Issue 11, item 7: property-based fuzzing of every operation of ``/api/schema/`` against a live server.

Schemathesis reads the schema the server publishes, generates requests
from it (path ids, query filters, bodies, headers) and sends them over
real HTTP to pytest-django's live server, as staff (who may call every
operation). Every answer must be below 500 and conform to the schema:
documented status, content type, headers and body (the error object
included). A few derandomised examples per operation keep it bounded
(well under a minute); ``TOLLGATE_SCHEMA_EXAMPLES`` runs it longer.

Each operation is driven through its Hypothesis strategy
(``APIOperation.as_strategy``) rather than schemathesis's pytest plugin,
whose lazy loader does not run under the pytest this project uses.
"""

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, note, settings
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.support.security import core_approval_item  # noqa: E402,F401 - a pending item, so decisions have one to find

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = int(os.environ.get("TOLLGATE_SCHEMA_EXAMPLES", "6"))
# No 5xx, and the answer is one the schema describes. (Not "a schema-valid request is accepted":
# a well-formed cursor or slug may still name nothing, and that is a documented 400.)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
BOUNDED = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                   phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))


def test_every_operation_answers_within_its_schema(live_server, people, core_approval_item):
    token, _ = Token.objects.get_or_create(user=people["admin"])
    headers = {"Authorization": f"Token {token.key}"}
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/schema/?format=json", headers=headers, timeout=30)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 18
    assert "GET /api/runs/{run_id}/wait/" in {operation.label for operation in operations}  # not a DRF view

    failures = {}
    for operation in operations:

        @BOUNDED
        @given(case=operation.as_strategy())
        def answers_within_schema(case):
            note(f"{case.method} {case.formatted_path} {case.query} {case.body!r}")
            case.call_and_validate(base_url=live_server.url, headers=headers, checks=CHECKS, timeout=30)

        try:
            answers_within_schema()
        except (Exception, BaseExceptionGroup) as failure:  # noqa: BLE001 - collect every operation's failure
            failures[operation.label] = f"{type(failure).__name__}: {failure}"[:2000]
    assert failures == {}
