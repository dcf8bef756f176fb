"""``ModelError``: whether trying again may help, and how long the server asked to wait, survive screening."""

import pytest

from runs.model_output import storable_errors
from runs.providers.base import ModelError, StreamInterrupted


def test_a_model_error_is_not_transient_unless_said():
    error = ModelError("OpenAI API error 400 (BadRequestError)")
    assert (error.transient, error.retry_after_s, error.detail) == (False, None, "")


def test_screening_an_unstorable_text_keeps_the_kind_the_detail_and_the_wait():
    with pytest.raises(StreamInterrupted) as caught, storable_errors():
        raise StreamInterrupted("broke\x00off", detail="said\x00this", transient=True, retry_after_s=7.0)
    error = caught.value
    assert "\x00" not in str(error) and "\x00" not in error.detail
    assert (error.transient, error.retry_after_s) == (True, 7.0)
