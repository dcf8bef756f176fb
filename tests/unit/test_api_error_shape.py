"""The REST API's error body for exceptions DRF does not know (``config.api.exception_handler``), no request needed.

Django's ``ValidationError`` gets the same ``{"error": {"code", "message",
"details"}}`` shape as DRF's own; anything else is left to become a 500.
Every error answer of the endpoints is tests/api/test_errors.py.
"""

import pytest
from django.core.exceptions import ValidationError

from config.api import exception_handler


@pytest.mark.parametrize("error, fields", [
    (ValidationError({"amount": ["Too much."]}), {"amount": ["Too much."]}),
    (ValidationError("Bad as a whole."), {"non_field_errors": ["Bad as a whole."]}),
])
def test_djangos_validation_errors_get_the_same_shape(error, fields):
    response = exception_handler(error, {})

    assert response.status_code == 400
    assert response.data == {"error": {"code": "invalid", "message": next(iter(fields.values()))[0],
                                       "details": {"fields": fields}}}


def test_an_unknown_exception_is_left_to_become_a_500():
    assert exception_handler(ValueError("a bug"), {}) is None
