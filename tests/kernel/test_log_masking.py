"""No secret in a log line (issue 26): a provider's error answer quoting the key and a password was logged in clear.

Every log record of the process is masked as it is made
(``runs.base.masking.install_log_masking``, installed when the ``runs`` app is
ready), so whatever handler prints it, the server's console, a worker's or
pytest's ``caplog``, sees ``***`` instead.
"""

import logging

import pytest

from runs.base.masking import mask_log_text
from tests.support.provider import core_llm, run_to_rest  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-test-0123456789abcdefSECRET"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_provider_error_quoting_the_key_and_a_password_is_logged_masked(worker, people, core_llm, provider, caplog,
                                                                          monkeypatch):
    answer = (f"Incorrect API key provided: {KEY}. Your request: "
              '{"password": "hunter2-db", "db": "postgres://svc:pg-pass-77@db.internal/x"}')
    server, agent = core_llm(provider, [{"status": 401, "message": answer}])
    monkeypatch.setenv("TEST_KEY", KEY)  # the key the run is sent with, from the endpoint profile's variable

    run = run_to_rest(worker, agent, people["requester"])

    assert (run.status, run.failure_type) == ("failed", "model_error")
    logged = caplog.text
    assert "Incorrect API key provided" in logged, "the provider's own words are still logged"
    for secret in (KEY, "hunter2-db", "pg-pass-77"):
        assert secret not in logged
    headers = {k.lower(): v for k, v in server.requests[0]["headers"].items()}
    assert KEY in (headers.get("x-api-key"), headers.get("authorization", "").removeprefix("Bearer "))


def test_every_record_is_masked_whatever_logs_it_arguments_and_tracebacks_included(caplog, monkeypatch):
    monkeypatch.setenv("PAYMENT_GATEWAY_TOKEN", "gw-token-4711-abc")
    logger = logging.getLogger("some.library")
    with caplog.at_level(logging.INFO):
        logger.warning("login failed for %s with password=%s", "bob", "hunter2")
        logger.info("calling %(url)s", {"url": "https://api.example.com/x?api_key=q1w2e3r4t5&page=2"})
        try:
            raise ConnectionError("gateway refused token gw-token-4711-abc")
        except ConnectionError:
            logger.exception("gateway call failed")

    text = caplog.text
    for secret in ("hunter2", "q1w2e3r4t5", "gw-token-4711-abc"):
        assert secret not in text
    assert "login failed for bob" in text and "page=2" in text and "ConnectionError" in text


@pytest.mark.parametrize("line, shown", [
    ("Authorization: Bearer abc.def.ghi", "Authorization: ***"),
    ('{"api_key": "k-123456", "amount": 80}', '{"api_key": "***", "amount": 80}'),
    ("client_secret=s3cr3t&order=123", "client_secret=***&order=123"),
    ("redis://:r3d1s@cache:6379/0", "redis://***@cache:6379/0"),
    ("refund 80.00 on order 123 (12 tokens used)", "refund 80.00 on order 123 (12 tokens used)"),
    # names that only contain a credential's word keep their values: the log must stay useful
    ("input_tokens=1234 output_tokens=56 max_tokens: 4096", "input_tokens=1234 output_tokens=56 max_tokens: 4096"),
    ("csrf_token_age=3 tokenizer=cl100k", "csrf_token_age=3 tokenizer=cl100k"),
    ("access_token=zz9 clientSecret=abc x-api-key: k1", "access_token=*** clientSecret=*** x-api-key: ***"),
])
def test_mask_log_text_hides_the_value_and_keeps_the_rest(line, shown):
    assert mask_log_text(line) == shown
    assert mask_log_text(shown) == shown  # masking twice changes nothing more
