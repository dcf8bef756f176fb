"""Serving an answer file (``approvals.models.AnswerFile``) to someone allowed to have it.

Who may have it is the caller's check (``approvals.selectors.answer_file_visible``:
users who may see the run); this only builds the response, shared by the
API and the item page: the stored bytes as an attachment under the name
sent, with the content type decided when it came, ``nosniff`` (so no
browser renders it as something else) and ``Cache-Control: private, no-store``.
"""

from django.http import FileResponse

from approvals.models import AnswerFile


def answer_file_response(answer_file: AnswerFile) -> FileResponse:
    """A streaming download of ``answer_file`` (see module doc)."""
    response = FileResponse(answer_file.file.open("rb"), as_attachment=True, filename=answer_file.name,
                            content_type=answer_file.content_type)
    response["X-Content-Type-Options"] = "nosniff"
    response["Cache-Control"] = "private, no-store"
    return response
