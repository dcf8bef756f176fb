"""Files that answer a question: what a question allows, and checking a file against it.

A question (an ``ask_user`` call) says with its arguments whether a file
may come with the answer (``file``: ``none``, the default, ``optional`` or
``required``) and of which content types (``file_types``, each one of the
operator's ``TOLLGATE["ANSWER_FILE_TYPES"]``; omitted: all of those).

A file is judged by its bytes, never by what the sender says it is:
binary formats by their magic numbers (the ``filetype`` library: PDF,
PNG, JPEG, ...); anything without one must be UTF-8 text without NUL,
and is then ``text/csv`` or ``application/json`` when its declared type or
its name's extension says so (JSON must parse), else ``text/plain``. The
type found must be allowed; the size must be within
``TOLLGATE["ANSWER_FILE_MAX_BYTES"]`` (``TooLarge``, 413). What the model
is told (``summary``) is the metadata and, for a text file, its first
``TOLLGATE["ANSWER_FILE_TEXT_CHARS"]`` characters.
"""

import hashlib
import mimetypes
import unicodedata
from dataclasses import dataclass
from pathlib import PurePath

import filetype
from django.conf import settings

from config import strict_json
from runs.base.errors import InvalidInput, TooLarge

FILE_MODES = ("none", "optional", "required")
TEXT_TYPES = ("text/plain", "text/csv", "application/json")
MAX_NAME_CHARS = 255


@dataclass(frozen=True)
class FileRule:
    """What a question allows: ``mode`` (one of ``FILE_MODES``) and the ``types`` a file may have."""

    mode: str
    types: tuple[str, ...]


def file_rule(arguments: dict | None) -> FileRule:
    """The rule of a question from its ``ask_user`` ``arguments`` (types outside the setting's list are dropped)."""
    arguments = arguments or {}
    allowed = tuple(settings.TOLLGATE["ANSWER_FILE_TYPES"])
    asked = arguments.get("file_types")
    types = tuple(t for t in asked if t in allowed) if asked else allowed
    return FileRule(mode=arguments.get("file", "none"), types=types)


@dataclass(frozen=True)
class CheckedFile:
    """A file that passed ``check``: its ``content`` (bytes), cleaned ``name``, decided ``content_type``,
    ``size`` (bytes) and ``sha256`` (hex)."""

    content: bytes
    name: str
    content_type: str
    size: int
    sha256: str


def clean_name(name: str) -> str:
    """The last part of a sent file name, without control characters, at most 255 characters ("file" if empty)."""
    base = PurePath((name or "").replace("\\", "/")).name
    base = "".join(ch for ch in base if unicodedata.category(ch)[0] != "C").strip()
    return base[-MAX_NAME_CHARS:] or "file"


def _text_type(content: bytes, name: str, declared: str) -> str | None:
    """``content``'s text type (see module doc), or None when it is not UTF-8 text."""
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\x00" in text:
        return None
    claims = [(declared or "").split(";")[0].strip().lower(), mimetypes.guess_type(name)[0] or ""]
    found = next((claim for claim in claims if claim in TEXT_TYPES), "text/plain")
    if found == "application/json":
        try:
            strict_json.loads(text)
        except strict_json.StrictJSONError as exc:
            raise InvalidInput.for_fields({"file": f"The file is not acceptable JSON: {exc}"}) from None
    return found


def content_type_of(content: bytes, name: str, declared: str = "") -> str | None:
    """The content type of ``content`` decided from its bytes (see module doc); None when unknown."""
    kind = filetype.guess(content)
    if kind is not None:
        return kind.mime
    return _text_type(content, name, declared)


def check(upload, rule: FileRule) -> CheckedFile:
    """Read ``upload`` (a Django ``UploadedFile``) and check it against ``rule``.

    Raises ``TooLarge`` (413, ``details``: ``limit_bytes``, ``field``) over
    the size limit, without reading the content, and ``InvalidInput``
    (field ``file``) when the question takes no file or the type is not
    allowed.
    """
    if rule.mode == "none":
        raise InvalidInput.for_fields({"file": "This question takes no file."})
    limit = settings.TOLLGATE["ANSWER_FILE_MAX_BYTES"]
    if upload.size > limit:
        raise TooLarge(f"The file is over the limit of {limit} bytes.", details={"limit_bytes": limit, "field": "file"})
    content = b"".join(upload.chunks())
    name = clean_name(upload.name)
    found = content_type_of(content, name, getattr(upload, "content_type", "") or "")
    if found not in rule.types:
        raise InvalidInput.for_fields({"file": f"Files of type {found or 'unknown'} are not accepted here; "
                                               f"accepted: {', '.join(rule.types) or 'none'}."})
    return CheckedFile(content=content, name=name, content_type=found, size=len(content),
                       sha256=hashlib.sha256(content).hexdigest())


def summary(answer_file, content: bytes) -> dict:
    """What the model is told about an ``AnswerFile`` with ``content``: id, name, content_type, size, sha256
    and, for a text file, ``text`` (its first ``ANSWER_FILE_TEXT_CHARS`` characters) and ``text_truncated``."""
    found = {"id": answer_file.pk, "name": answer_file.name, "content_type": answer_file.content_type,
             "size": answer_file.size, "sha256": answer_file.sha256}
    if answer_file.content_type in TEXT_TYPES:
        limit = settings.TOLLGATE["ANSWER_FILE_TEXT_CHARS"]
        text = content.decode("utf-8")
        found.update(text=text[:limit], text_truncated=len(text) > limit)
    return found
