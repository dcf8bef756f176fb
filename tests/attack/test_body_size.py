"""Bodies over the limit are refused while they are read, before anyone is authenticated (issue 26).

Found by attacking the served app: an unauthenticated ``POST
/accounts/login/`` with a 1.5 GB body (or ``/api/runs/`` with 300 MB) was
read completely, the server's memory going from 129 MB to 1.6 GB plus
1.5 GB of temporary files, before the 403/401. Now no body over
``TOLLGATE["REQUEST_BODY_MAX_BYTES"]`` is read (``config.body_limit``):
by the served Daphne (``config.http_server``) and by the ASGI application
under any server (``config.asgi``).

The served tests stream 1.5 GB from a generator (never held in this
process) to ``manage.py serve`` over a socket and read the server's peak
memory (``VmHWM`` in ``/proc/<pid>/status``) before and after.
"""

import json
import socket
from urllib.parse import urlsplit

import httpx
import pytest
from asgiref.sync import async_to_sync
from channels.testing import ApplicationCommunicator
from rest_framework.authtoken.models import Token

from approvals.models import AnswerFile
from tests.support.answer_files import asking
from tests.support.core import serving_core

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def served_process(people, tmp_path):
    """``(base URL, its subprocess.Popen)`` of ``manage.py serve`` against the test database (``serving_core``)."""
    with serving_core(people, tmp_path) as served:
        yield served

GB_1_5 = 1_500_000_000
BLOCK = b"x" * (1 << 20)
# The server's peak memory may grow by less than this while refusing 1.5 GB.
RSS_BUDGET = 50 * 1024 * 1024


def _peak_rss(pid: int) -> int:
    """Peak resident memory of process ``pid`` so far, in bytes (``VmHWM`` of ``/proc/<pid>/status``)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


def _blocks(total: int, *, chunked: bool):
    """``total`` bytes of body in 1 MiB blocks, generated as they are sent; chunk-framed when ``chunked``."""
    for _ in range(total // len(BLOCK)):
        yield b"%x\r\n%s\r\n" % (len(BLOCK), BLOCK) if chunked else BLOCK
    if chunked:
        yield b"0\r\n\r\n"


def _stream(base: str, path: str, headers: dict[str, str], body) -> tuple[bytes, int]:
    """``(what the server answered, body bytes it took)`` for a POST of ``body`` (an iterable of bytes) to ``path``.

    Sent over a raw socket: sending stops when the server closes the
    connection; what it answered is read until it closes (empty if the
    close reset the connection before the answer could be read).
    """
    address = urlsplit(base)
    head = "".join(f"{name}: {value}\r\n" for name, value in {"Host": address.netloc, **headers}.items())
    sent = 0
    with socket.create_connection((address.hostname, address.port), timeout=60) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode())
        try:
            for block in body:
                sock.sendall(block)
                sent += len(block)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while data := sock.recv(65536):
                answer += data
        except ConnectionResetError:
            pass
    return answer, sent


def _refused(answer: bytes, sent: int, limit: int) -> None:
    """A 413 (or a closed connection) after the server took little more than ``limit`` bytes."""
    assert answer == b"" or answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert sent < limit + 64 * 1024 * 1024, f"the server took {sent} bytes"


def test_a_declared_1_5_gb_login_body_is_refused_unread(served_process, settings):
    base, process = served_process
    peak_before = _peak_rss(process.pid)
    answer, sent = _stream(base, "/accounts/login/",
                           {"Content-Type": "application/x-www-form-urlencoded", "Content-Length": str(GB_1_5)},
                           _blocks(GB_1_5, chunked=False))
    _refused(answer, sent, settings.TOLLGATE["REQUEST_BODY_MAX_BYTES"])
    assert _peak_rss(process.pid) - peak_before < RSS_BUDGET
    # The server goes on serving.
    assert httpx.get(base + "/accounts/login/", timeout=10).status_code == 200


def test_a_chunked_1_5_gb_api_body_is_cut_off_at_the_limit(served_process, settings):
    base, process = served_process
    limit = settings.TOLLGATE["REQUEST_BODY_MAX_BYTES"]
    peak_before = _peak_rss(process.pid)
    answer, sent = _stream(base, "/api/runs/", {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
                           _blocks(GB_1_5, chunked=True))
    _refused(answer, sent, limit)
    assert _peak_rss(process.pid) - peak_before < RSS_BUDGET
    if answer:  # the API's error object
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == {
            "code": "too_large", "message": f"Request body too large: the limit is {limit} bytes.",
            "details": {"limit_bytes": limit}}


def test_a_body_declared_too_large_is_answered_413_before_it_is_sent(served_process, settings):
    # A client that waits for "100 Continue" is told at once, and sends nothing.
    base, _ = served_process
    limit = settings.TOLLGATE["REQUEST_BODY_MAX_BYTES"]
    answer, sent = _stream(base, "/api/runs/?x=1", {"Content-Length": str(limit + 1), "Expect": "100-continue"}, [])
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 413 ") and b"Connection: close" in head
    assert json.loads(body)["error"]["code"] == "too_large"
    # A page's 413 is one line of text.
    answer, _ = _stream(base, "/accounts/login/", {"Content-Length": str(limit + 1), "Expect": "100-continue"}, [])
    assert answer.endswith(f"\r\n\r\nRequest body too large: the limit is {limit} bytes.".encode())


def test_the_largest_legitimate_body_still_goes_through(served_process, worker, people, api, settings):
    # An answer file just under its own limit, in a multipart body: under the server's limit.
    base, _ = served_process
    _, item_id = asking(worker, people, api, "asks-for-a-big-csv", file="required", file_types=["text/csv"])
    row = b"acme,80.00\n"
    content = b"account,amount\n" + row * ((settings.TOLLGATE["ANSWER_FILE_MAX_BYTES"] - 1024) // len(row))
    token, _ = Token.objects.get_or_create(user=people["requester"])
    answer = httpx.post(f"{base}/api/interrupts/{item_id}/respond/", data={"answer": "Here."},
                        files={"file": ("statement.csv", content, "text/csv")},
                        headers={"Authorization": f"Token {token.key}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert AnswerFile.objects.get(interrupt_id=item_id).size == len(content)


def _asgi(path: str, headers: list, messages: list) -> list[dict]:
    """The messages ``config.asgi.application`` sends for a POST to ``path`` given ``messages`` (``http.request``s).

    The application is not told the body ended unless ``messages`` says so.
    """
    from config.asgi import application

    async def exchange():
        communicator = ApplicationCommunicator(application, {
            "type": "http", "http_version": "1.1", "method": "POST", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "", "scheme": "http", "client": ["127.0.0.1", 5000],
            "server": ["testserver", 80], "headers": [(b"host", b"testserver"), *headers]})
        for message in messages:
            await communicator.send_input(message)
        start = await communicator.receive_output(10)
        body = await communicator.receive_output(10)
        await communicator.wait(10)
        return [start, body]

    return async_to_sync(exchange)()


def test_under_any_asgi_server_a_declared_body_over_the_limit_is_413_unread(settings):
    limit = settings.TOLLGATE["REQUEST_BODY_MAX_BYTES"]
    # Not one body message sent: the application answers from the header alone.
    start, body = _asgi("/api/runs/", [(b"content-length", str(limit + 1).encode())], [])
    assert start["status"] == 413
    assert json.loads(body["body"])["error"] == {
        "code": "too_large", "message": f"Request body too large: the limit is {limit} bytes.",
        "details": {"limit_bytes": limit}}


def test_under_any_asgi_server_a_growing_body_is_cut_off_at_the_limit(settings):
    settings.TOLLGATE = {**settings.TOLLGATE, "REQUEST_BODY_MAX_BYTES": 3 * len(BLOCK)}
    # Ten blocks arrive and the body never ends: the 413 comes after the fourth.
    messages = [{"type": "http.request", "body": BLOCK, "more_body": True}] * 10
    start, body = _asgi("/accounts/login/", [(b"transfer-encoding", b"chunked")], messages)
    assert start["status"] == 413
    assert body["body"] == f"Request body too large: the limit is {3 * len(BLOCK)} bytes.".encode()
