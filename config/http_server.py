"""Daphne with a request body limit (``config.body_limit``): the server ``manage.py serve`` and production run.

Daphne's request (a ``twisted.web.http.Request``) writes the whole body
to memory or a temporary file before the ASGI application is even
created, then queues all of it for the application at once: a 1.5 GB
``POST`` to the login page was read in full before its 403. Here the
request refuses a body over ``TOLLGATE["REQUEST_BODY_MAX_BYTES"]``:

* a ``Content-Length`` over the limit: 413 as soon as the headers are in,
  nothing of the body read, the connection closed;
* a body that grows past the limit while arriving (chunked): 413 at the
  byte that crosses it, the connection closed, nothing handed on.

Production runs it as Daphne's own command line would be run::

    python -m config.http_server -b 0.0.0.0 -p 8000 config.asgi:application

(same options as ``daphne``).
"""

import daphne.server  # first: it installs the asyncio reactor Twisted must use (isort: skip)
from daphne.cli import CommandLineInterface
from daphne.http_protocol import HTTPFactory, WebRequest

from config.body_limit import max_body_bytes, too_large_answer


class BodyLimitedWebRequest(WebRequest):
    """Daphne's HTTP request, refusing a body over ``max_body_bytes()`` while it is received (413)."""

    refused = False
    body_received = 0

    def gotLength(self, length):
        """Twisted's "headers are in": ``length`` is the ``Content-Length`` (``None`` without one).

        Over the limit: the 413 is sent and the connection closed before any
        of the body is read (no ``100 Continue`` either).
        """
        self.body_limit = max_body_bytes()
        if length is not None and length > self.body_limit:
            self.requestHeaders.removeHeader(b"Expect")
            self._refuse()
            return
        super().gotLength(length)

    def handleContentChunk(self, data):
        """Twisted's "body bytes arrived"; stored only while the total stays within the limit."""
        if self.refused:
            return
        self.body_received += len(data)
        if self.body_received > self.body_limit:
            self._refuse()
            return
        super().handleContentChunk(data)

    def requestReceived(self, command, path, version):
        """Twisted's "whole request in": handed on to the application unless it was refused."""
        if not self.refused:
            super().requestReceived(command, path, version)

    def _refuse(self):
        """Answer 413 (the API's error object under ``/api/``) and close the connection.

        Written straight to the transport: the request line has been read
        (the channel holds its path) but Twisted has not made it the
        request's yet, so the response machinery of ``Request`` is not
        ready. The connection is closed, so nothing more is read.
        """
        self.refused = True
        target = getattr(self.channel, "_path", b"/").split(b"?", 1)[0]
        content_type, body = too_large_answer(target.decode("latin-1"))
        self.channel.transport.write(b"".join([
            b"HTTP/1.1 413 Content Too Large\r\n",
            b"Content-Type: " + content_type.encode() + b"\r\n",
            b"Content-Length: " + str(len(body)).encode() + b"\r\n",
            b"Connection: close\r\n\r\n",
            body,
        ]))
        self.loseConnection()


class BodyLimitedHTTPFactory(HTTPFactory):
    """Daphne's HTTP factory making ``BodyLimitedWebRequest``s."""

    def buildProtocol(self, addr):
        protocol = super().buildProtocol(addr)
        protocol.requestFactory = BodyLimitedWebRequest
        return protocol


class BodyLimitedServer(daphne.server.Server):
    """Daphne's server whose HTTP requests are ``BodyLimitedWebRequest``s.

    ``Server.run`` builds its HTTP factory itself (``self.http_factory =
    HTTPFactory(self)``) and listens with it at once; the property below
    makes that assignment store the limited factory instead.
    """

    @property
    def http_factory(self):
        return self._http_factory

    @http_factory.setter
    def http_factory(self, factory):
        self._http_factory = BodyLimitedHTTPFactory(factory.server)


class BodyLimitedCommandLine(CommandLineInterface):
    """Daphne's command line (``daphne ...``) running ``BodyLimitedServer``."""

    server_class = BodyLimitedServer


if __name__ == "__main__":
    BodyLimitedCommandLine.entrypoint()
