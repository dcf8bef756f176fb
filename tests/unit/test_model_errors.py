"""``ModelError``: whether trying again may help, and how long the server asked to wait, survive screening."""

import pytest

from runs.base.model_output import storable_errors
from runs.base.model_call import ModelError, StreamInterrupted


def test_a_model_error_is_not_transient_unless_said():
    error = ModelError("OpenAI API error 400 (BadRequestError)")
    assert (error.transient, error.retry_after_s, error.detail) == (False, None, "")


def test_screening_an_unstorable_text_keeps_the_kind_the_detail_and_the_wait():
    with pytest.raises(StreamInterrupted) as caught, storable_errors():
        raise StreamInterrupted("broke\x00off", detail="said\x00this", transient=True, retry_after_s=7.0)
    error = caught.value
    assert "\x00" not in str(error) and "\x00" not in error.detail
    assert (error.transient, error.retry_after_s) == (True, 7.0)


def test_screening_keeps_the_status_and_screens_a_detail_that_alone_cannot_be_stored():
    with pytest.raises(ModelError) as caught, storable_errors():
        raise ModelError("OpenAI API error 400 (BadRequestError)", detail="bad \ud800 name", status=400)
    error = caught.value
    assert error.detail == "bad \ufffd name" and error.status == 400
    assert error.readable() == "OpenAI API error 400 (BadRequestError): bad \ufffd name"
    assert error.server_answer() == {"status": 400, "message": "bad \ufffd name"}
