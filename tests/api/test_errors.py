"""Issue 11, item 1: every error answer of the REST API has one body, and the schema says so.

``{"error": {"code", "message", "details"}}`` for DRF's own exceptions
(401, 403, 404, 405, 415, 400 parse and field errors), the services'
errors (409 with the current status, session_busy with its active run)
and the size limit (413); the throttles' 429 is in test_security_access.
The handler's shape for Django's own ``ValidationError`` (no request needed)
is tests/unit/test_api_error_shape.py.
"""

import json

from rest_framework.test import APIClient

from runs.models import Run
from tests.support.api import error_of, field_errors, start_run


def test_anonymous_requests_get_401_with_the_token_challenge(people):
    response = APIClient().get("/api/runs/")

    assert error_of(response, 401)["code"] == "not_authenticated"
    assert response["WWW-Authenticate"] == "Token"


def test_a_wrong_token_gets_401(people):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")

    assert error_of(client.get("/api/runs/"), 401)["code"] == "authentication_failed"


def test_a_missing_permission_is_403_with_the_reason(people, api):
    body = {"slug": "mine", "name": "Mine", "model": {"provider": "scripted", "turns": []}}

    assert error_of(api(people["requester"]).post("/api/agents/", body, format="json"), 403)["code"] == \
        "permission_denied"


def test_deciding_ones_own_item_is_403_naming_why(people, api, worker, asking):
    requester = api(people["requester"])
    run = start_run(requester, asking)
    worker.drain()
    item = requester.get("/api/interrupts/", {"run": run["id"]}).json()["results"][0]

    error = error_of(requester.post(f"/api/interrupts/{item['id']}/approve/", {}, format="json"), 403)

    assert (error["code"], error["message"]) == ("permission_denied", "You may not decide this item.")


def test_missing_objects_are_404_without_naming_the_model(people, api):
    error = error_of(api(people["approver"]).get("/api/runs/987654/"), 404)

    assert error["code"] == "not_found" and "Run" not in error["message"]


def test_a_verb_the_endpoint_lacks_is_405(people, api, asking):
    run = start_run(api(people["requester"]), asking)

    response = api(people["requester"]).delete(f"/api/runs/{run['id']}/")

    assert error_of(response, 405)["code"] == "method_not_allowed"
    assert Run.objects.filter(pk=run["id"]).exists()


def test_a_form_encoded_body_is_415(people, api, asking):
    response = api(people["requester"]).post("/api/runs/", {"agent": asking, "input": "hi"})

    assert error_of(response, 415)["code"] == "unsupported_media_type"
    assert not Run.objects.exists()


def test_malformed_json_is_a_parse_error(people, api):
    response = api(people["requester"]).post("/api/runs/", data='{"agent": ', content_type="application/json")

    assert error_of(response, 400)["code"] == "parse_error"


def test_field_errors_are_listed_by_field_and_the_message_is_the_first(people, api):
    response = api(people["requester"]).post("/api/runs/", {"agent": "no-such-agent", "input": ""}, format="json")

    fields = field_errors(response)
    assert set(fields) == {"agent", "input"}
    assert response.json()["error"]["message"] in fields["agent"] + fields["input"]


def test_a_body_that_is_not_an_object_is_a_non_field_error(people, api):
    response = api(people["requester"]).post("/api/runs/", data="[1, 2]", content_type="application/json")

    assert list(field_errors(response)) == ["non_field_errors"]


def test_the_schema_documents_the_error_object_on_every_error_status(people, api):
    schema = json.loads(api(people["requester"]).get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
                        .content)

    error = schema["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]
    assert error["properties"]["error"]["required"] == ["code", "message", "details"]
    operations = [(path, method, op) for path, ops in schema["paths"].items() for method, op in ops.items()]
    assert len(operations) >= 18
    for path, method, operation in operations:
        statuses = {s for s in operation["responses"] if s.startswith("4")}
        expected = {"400", "401", "403", "429"} | ({"404"} if "{" in path else set()) | (
            {"409", "413", "415", "422"} if method == "post" else set())
        assert expected <= statuses, (path, method, statuses)
        for status in statuses:
            content = operation["responses"][status]["content"]["application/json"]
            assert content["schema"] == {"$ref": "#/components/schemas/Error"}, (path, method, status)
