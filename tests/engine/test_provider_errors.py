"""Provider HTTP errors: the engine tries a transient one again after a backoff, then the run fails model_error.

The SDK makes one attempt per call; each attempt is a step of its own. The
500 answers carry ``retry-after-ms`` and the 429 ``Retry-After: 0``, so the
engine's backoff (the server's word when it gives one) stays short; a
``Retry-After`` past ``INLINE_BACKOFF_MAX_S`` puts the run to wait instead.
"""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from runs.engine import runtime
from runs.sweeping import sweep
from tests.support.provider import TRANSFER_5, core_llm, events, run_to_rest  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)
PROVIDERS = ["openai", "anthropic"]
NAMES = {"openai": "OpenAI", "anthropic": "Anthropic"}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_rate_limited_then_answered_completes(worker, people, core_llm, provider):
    server, agent = core_llm(provider, [
        {"status": 429, "message": "Rate limit reached, slow down.", "headers": {"Retry-After": "0"}},
        {"tool_calls": [TRANSFER_5]},
        {"content": "Sent 5."},
    ])
    run = run_to_rest(worker, agent, people["requester"], "Send 5 to acme.")
    assert (run.status, run.outcome) == ("completed", "achieved")
    assert len(server.requests) == 3
    assert server.bodies()[0] == server.bodies()[1], "the retry re-sends the same request"
    assert list(run.steps.values_list("status", flat=True)) == ["failed", "succeeded", "succeeded"]
    assert run.model_calls == 2


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_outage_waits_holding_no_worker_and_the_run_completes_once_the_model_is_back(worker, people, core_llm,
                                                                                       provider):
    server, agent = core_llm(provider, [
        {"status": 503, "message": "Service unavailable.", "headers": {"Retry-After": "30"}},
        {"tool_calls": [TRANSFER_5]},
        {"content": "Sent 5."},
    ])
    asked_at = timezone.now()
    run = run_to_rest(worker, agent, people["requester"], "Send 5 to acme.")
    assert (run.status, run.waiting_reason) == ("waiting", "retry_backoff")
    assert timedelta(seconds=29) <= run.wake_at - asked_at <= timedelta(seconds=40), "Retry-After: 30 honoured"
    assert runtime.engine().in_flight == 0, "the wait holds no worker"
    assert len(server.requests) == 1

    type(run).objects.filter(pk=run.pk).update(wake_at=timezone.now() - timedelta(seconds=1))  # 30 s later
    sweep()
    worker.drain()
    run.refresh_from_db()
    assert (run.status, run.outcome) == ("completed", "achieved")
    assert list(run.steps.values_list("status", flat=True)) == ["failed", "succeeded", "succeeded"]
    assert len(server.requests) == 3


@pytest.mark.parametrize("provider", PROVIDERS)
def test_server_error_five_times_fails_with_model_error(worker, people, core_llm, provider):
    error = {"status": 500, "message": "The server had an error while processing your request.",
             "headers": {"retry-after-ms": "10"}}
    server, agent = core_llm(provider, [error] * 5, max_retries=4)
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "model_error")
    assert len(server.requests) == 5
    assert run.error == (f"{NAMES[provider]} API error 500 (InternalServerError): The server had an error while "
                         "processing your request. (gave up after 4 retries)")
    failed, = [e for e in events(run, "model_call") if e.reason == "failed"]
    assert failed.payload["error"] == run.error
    last = events(run, "transition")[-1]
    assert (last.to_status, last.reason, last.payload["failure_type"]) == ("failed", run.error, "model_error")


@pytest.mark.parametrize("provider", PROVIDERS)
def test_unauthorised_fails_at_once_with_status_class_and_the_servers_message(worker, people, core_llm, provider,
                                                                             caplog):
    server, agent = core_llm(provider, [{"status": 401, "message": "Incorrect API key provided."},
                                        {"content": "never"}])
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "model_error")
    assert len(server.requests) == 1
    assert run.error == f"{NAMES[provider]} API error 401 (AuthenticationError): Incorrect API key provided."
    assert "Incorrect API key provided." in caplog.text, "the provider's own text is logged"
    headers = {k.lower(): v for k, v in server.requests[0]["headers"].items()}
    assert "x" in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_400_reads_back_over_rest_on_the_run_and_its_step_for_whoever_may_read_the_run(
        worker, people, core_llm, provider, api, caplog):
    """A strict server refuses the request; its status and message are the integrator's to read, nobody else's."""
    message = "Invalid schema for function 'fake_transfer': 'amount' must be a string."
    server, agent = core_llm(provider, [{"status": 400, "message": message}, {"content": "never"}])
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "model_error")
    assert len(server.requests) == 1, "a 400 is not tried again"
    expected = f"{NAMES[provider]} API error 400 (BadRequestError): {message}"
    assert message in caplog.text

    requester = api(people["requester"])
    assert requester.get(f"/api/runs/{run.pk}/").json()["error"] == expected
    step, = requester.get(f"/api/runs/{run.pk}/steps/").json()["results"]
    assert (step["status"], step["error"], step["server_error"]) == ("failed", expected,
                                                                     {"status": 400, "message": message})
    ended = [e for e in requester.get(f"/api/runs/{run.pk}/events/").json()["results"] if e["to_status"] == "failed"]
    assert ended[-1]["reason"] == expected
    outsider = get_user_model().objects.create_user("outsider")
    assert api(outsider).get(f"/api/runs/{run.pk}/steps/").status_code == 404


@pytest.mark.parametrize("provider", PROVIDERS)
def test_the_servers_message_is_cut_short_and_its_credentials_masked_wherever_it_is_kept(
        worker, people, core_llm, provider, api, monkeypatch):
    monkeypatch.setenv("TEST_KEY", "the-endpoint-key-0042")  # the key this server is sent, echoed back below
    message = ("bad request from key sk-abcdefghijklmnopqrstuvwx, the-endpoint-key-0042 at "
               "https://u:hunter2@models.internal/v1 api_key=s3cr3t-value " + "x" * 1000)
    server, agent = core_llm(provider, [{"status": 400, "message": message}])
    run = run_to_rest(worker, agent, people["requester"])

    step = run.steps.get()
    body = str(api(people["requester"]).get(f"/api/runs/{run.pk}/steps/").json())
    run_body = str(api(people["requester"]).get(f"/api/runs/{run.pk}/").json())
    for kept in (run.error, step.error, body, run_body):
        assert "bad request from key" in kept
        for secret in ("sk-abcdefghijklmnopqrstuvwx", "the-endpoint-key-0042", "hunter2", "s3cr3t-value"):
            assert secret not in kept
    assert step.error == run.error and len(step.response["error"]["message"]) == 300
    assert step.response["error"]["message"].endswith("x…")


def test_missing_api_key_fails_before_any_request(worker, people, core_llm, monkeypatch):
    server, agent = core_llm("openai", [{"content": "never"}])
    monkeypatch.delenv("TEST_KEY")
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "model_error")
    assert run.error == f"The model endpoint {server.endpoint!r} has no API key configured on this server."
    assert server.requests == []


def test_unreachable_server_fails_with_model_error(worker, people, core_llm):
    server, agent = core_llm("openai", [], max_retries=0, timeout_s=2)
    server.stop()
    run = run_to_rest(worker, agent, people["requester"])
    assert (run.status, run.failure_type) == ("failed", "model_error")
    assert "unreachable" in run.error


@pytest.mark.parametrize("provider", PROVIDERS)
def test_stream_broken_off_mid_answer_is_discarded_and_asked_again(worker, people, core_llm, provider):
    server, agent = core_llm(provider, [
        {"tool_calls": [TRANSFER_5], "cut_after": 300},
        {"tool_calls": [TRANSFER_5]},
        {"content": "Sent 5."},
    ])
    run = run_to_rest(worker, agent, people["requester"], "Send 5 to acme.")
    assert (run.status, run.outcome) == ("completed", "achieved"), run.error
    assert len(server.requests) == 3
    assert list(run.steps.order_by("index").values_list("status", flat=True)) == ["discarded", "succeeded", "succeeded"]
    assert run.tool_calls.count() == 1, "nothing of the half answer was acted on"
    assert run.events.filter(type="model_call", reason__startswith="discarded: ").count() == 1


def test_stream_that_keeps_breaking_off_fails_with_model_error(worker, people, core_llm, settings):
    server, agent = core_llm("openai", [{"tool_calls": [TRANSFER_5], "cut_after": 200}] * 3)
    run = run_to_rest(worker, agent, people["requester"], "Send 5 to acme.")
    assert (run.status, run.failure_type) == ("failed", "model_error")
    assert "broke off" in run.error
    assert len(server.requests) == 3
