"""Every test of the demo talks to a fresh ledger of the demo's real gateway process."""

import pytest


@pytest.fixture(autouse=True)
def _fresh_gateway(payment_gateway):
    """``payment_gateway`` for every test here (``tests/conftest.py``)."""
    return payment_gateway
