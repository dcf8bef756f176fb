"""Where webhooks may go: never to this server, loopback, link-local or cloud metadata addresses, or private networks.

A subscription's URL is checked when it is saved (``check_url``: a clear
400 naming the reason) and again whenever a delivery opens a connection
(``GuardedBackend``: the addresses a name resolves to *at that moment*
are checked, and the connection goes to a checked address, so a name that
later resolves somewhere else — DNS rebinding — is refused too).
Redirects are not followed and proxies from the environment are not used
(``runs.webhooks.delivery``).

Refused, whatever the port:

* a host name this server answers to (``ALLOWED_HOSTS``, ``*`` aside) or
  an address of this machine's own host name;
* loopback and unspecified addresses (``127.0.0.0/8``, ``::1``,
  ``0.0.0.0``, ``::``);
* link-local and cloud metadata addresses (``169.254.0.0/16``,
  ``fe80::/10``, ``fd00:ec2::254``, ``100.100.100.200``);
* multicast, reserved and other non-global addresses, private networks
  (``10/8``, ``172.16/12``, ``192.168/16``, ``100.64/10``, ``fc00::/7``)
  included — those are allowed with ``TOLLGATE["WEBHOOK_ALLOW_PRIVATE_NETWORKS"]``.

IPv4 addresses inside IPv6 ones (``::ffff:a.b.c.d``, 6to4, Teredo, NAT64
``64:ff9b::/96``) are judged as the IPv4 address too. Any other IPv6
address outside global unicast ``2000::/3`` (RFC 4291 2.4), such as the
deprecated IPv4-compatible ``::a.b.c.d`` (``::127.0.0.1``), which Python's
``is_global`` calls global, is refused as reserved.
``TOLLGATE["WEBHOOK_ALLOWED_HOSTS"]`` lists host names (exact) and
addresses or networks (``10.1.2.0/24``) an operator trusts: they pass
every check above. Plain ``http`` needs
``TOLLGATE["WEBHOOK_ALLOW_HTTP"]``; user names and passwords in the URL
are refused. The idea follows the OWASP SSRF prevention cheat sheet
(resolve, check every address, connect only to a checked one).

Those three settings are the webhooks' ``Rules`` (``webhook_rules``); other
outgoing calls under the same guard bring rules of their own (the HTTP
tools' endpoint profiles, ``tools.http``) and connect through
``guarded_client`` / ``guarded_async_client``; the MCP servers' connections
(``tools.mcp.client``, another HTTP stack) go through ``connect_checked``
under the webhooks' rules.
"""

import functools
import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import anyio
import httpcore
import httpx
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.http.request import validate_host

from runs.base.errors import InvalidInput

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA = [ipaddress.ip_network(net) for net in ("169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128",
                                                   "100.100.100.200/32")]
PRIVATE = [ipaddress.ip_network(net) for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                  "100.64.0.0/10", "fc00::/7")]
NAT64 = ipaddress.ip_network("64:ff9b::/96")
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
HINT = ("Webhooks go to public addresses only; an operator may allow hosts with TOLLGATE_WEBHOOK_ALLOWED_HOSTS "
        "or private networks with TOLLGATE_WEBHOOK_ALLOW_PRIVATE_NETWORKS.")


@dataclass(frozen=True)
class Rules:
    """What the guard lets through beyond public addresses, and how a refusal says so.

    ``allowed_hosts``: exact host names, addresses or networks (``10.1.2.0/24``) always trusted; ``allow_private_networks``
    (never loopback or metadata); ``allow_http``: plain ``http://``. ``hint``, ``http_refusal``: refusal messages.
    """

    allowed_hosts: tuple[str, ...] = ()
    allow_private_networks: bool = False
    allow_http: bool = False
    hint: str = HINT
    http_refusal: str = "Use https://: plain http is off (TOLLGATE_WEBHOOK_ALLOW_HTTP)."


def webhook_rules() -> Rules:
    """The webhooks' rules, from ``TOLLGATE["WEBHOOK_ALLOWED_HOSTS"]``, ``["WEBHOOK_ALLOW_PRIVATE_NETWORKS"]``
    and ``["WEBHOOK_ALLOW_HTTP"]`` (read on every call, so a changed setting applies at once)."""
    return Rules(allowed_hosts=tuple(settings.TOLLGATE["WEBHOOK_ALLOWED_HOSTS"]),
                 allow_private_networks=settings.TOLLGATE["WEBHOOK_ALLOW_PRIVATE_NETWORKS"],
                 allow_http=settings.TOLLGATE["WEBHOOK_ALLOW_HTTP"])


class UnsafeURL(InvalidInput):
    """A webhook URL that may not be used (400, ``details={"url": [message]}``): see the module doc."""

    code = "unsafe_url"

    def __init__(self, message: str):
        super().__init__(message, details={"url": [message]})


class Unresolvable(UnsafeURL):
    """An ``UnsafeURL`` whose host name could not be resolved now (DNS failed, perhaps for a while): nothing was
    connected to, so an outgoing call may be tried again later (``tools.http``, ``tools.mcp.client``)."""

    code = "unresolvable_url"


def check_url(url: str, rules: Rules | None = None) -> None:
    """Check a URL before it is saved (a subscription's) or used; raises ``UnsafeURL`` saying why it is refused.

    Resolves the host name (DNS) and checks every address it gives, under
    ``rules`` (default: ``webhook_rules()``).
    """
    rules = rules or webhook_rules()
    try:
        URLValidator(schemes=["http", "https"])(url)
    except ValidationError:
        raise UnsafeURL("Enter a valid http:// or https:// URL.") from None
    parts = urlsplit(url)
    if parts.scheme == "http" and not rules.allow_http:
        raise UnsafeURL(rules.http_refusal)
    if parts.username is not None or parts.password is not None:
        raise UnsafeURL("The URL may not carry a user name or password.")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise UnsafeURL("The URL's port is not a valid port number.") from None
    checked_addresses(parts.hostname, port, rules)


def checked_addresses(host: str, port: int, rules: Rules | None = None) -> list[str]:
    """The addresses ``host`` resolves to now, if every one of them may be connected to under ``rules``
    (default: ``webhook_rules()``); else ``UnsafeURL`` (``Unresolvable`` when it does not resolve now).

    ``host`` is a name or an address literal (IPv6 without brackets).
    """
    rules = rules or webhook_rules()
    host = host.lower().rstrip(".")
    allowed = _allowlist(rules)
    trusted_name = host in allowed["names"] or _literal_in(host, allowed["networks"])
    if not trusted_name and validate_host(host, [h for h in settings.ALLOWED_HOSTS if h != "*"]):
        raise UnsafeURL(f"Refused: {host} is this server. {rules.hint}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise Unresolvable(f"The host {host} could not be resolved.") from None
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not trusted_name:
        for address in addresses:
            reason = refusal(ipaddress.ip_address(address), allowed["networks"],
                             allow_private_networks=rules.allow_private_networks)
            if reason:
                shown = host if host == address else f"{host} ({address})"
                raise UnsafeURL(f"Refused: {shown} is {reason}. {rules.hint}")
    return addresses


def refusal(address: IPAddress, trusted_networks=(), *, allow_private_networks: bool | None = None) -> str | None:
    """Why ``address`` may not be connected to (e.g. ``"a loopback address"``), or None if it may.

    ``allow_private_networks``: None reads ``TOLLGATE["WEBHOOK_ALLOW_PRIVATE_NETWORKS"]``.
    """
    if allow_private_networks is None:
        allow_private_networks = settings.TOLLGATE["WEBHOOK_ALLOW_PRIVATE_NETWORKS"]
    if _within(address, trusted_networks):
        return None
    if address.version == 6:
        embedded = [address.ipv4_mapped, address.sixtofour, *(address.teredo or ())]
        if address in NAT64:  # a NAT64 gateway turns it into the IPv4 address in its last 32 bits
            embedded.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        for inner in filter(None, embedded):
            if reason := refusal(inner, trusted_networks, allow_private_networks=allow_private_networks):
                return reason
        if address.ipv4_mapped or address in NAT64:  # judged above as the IPv4 address it carries
            return None
    if address.is_loopback or address.is_unspecified:
        return "a loopback address (this machine)"
    if _within(address, METADATA):
        return "a link-local or cloud metadata address"
    if address in _own_addresses():
        return "an address of this server"
    if address.is_multicast:
        return "a multicast address"
    if _within(address, PRIVATE):
        return None if allow_private_networks else "a private network address"
    if not address.is_global or (address.version == 6 and address not in GLOBAL_UNICAST_V6):
        return "a reserved or private address"
    return None


def _within(address: IPAddress, networks) -> bool:
    """Whether ``address`` is in one of ``networks`` (of either IP version)."""
    return any(address in network for network in networks if network.version == address.version)


def _literal_in(host: str, networks) -> bool:
    """Whether ``host`` is an address literal inside one of ``networks``."""
    try:
        return _within(ipaddress.ip_address(host), networks)
    except ValueError:
        return False


def _allowlist(rules: Rules) -> dict:
    """``rules.allowed_hosts`` split into ``names`` (lower case) and ``networks``."""
    names, networks = set(), []
    for entry in rules.allowed_hosts:
        try:
            networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            names.add(entry.lower().rstrip("."))
    return {"names": names, "networks": networks}


@functools.cache
def _own_addresses() -> frozenset:
    """The addresses this machine's host name resolves to (looked up once per process)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None)
    except (socket.gaierror, UnicodeError):
        return frozenset()
    return frozenset(ipaddress.ip_address(info[4][0]) for info in infos)


class GuardedBackend(httpcore.SyncBackend):
    """httpcore's network backend, but every TCP connection goes only to an address ``checked_addresses`` allows
    under ``rules`` (default: ``webhook_rules()``, read at each connection).

    Raises ``UnsafeURL`` (not an httpcore error, so it reaches the caller
    as it is) when the host or any address it resolves to is refused.
    """

    def __init__(self, rules: Rules | None = None):
        self.rules = rules

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        failure = None
        for address in checked_addresses(host, port, self.rules):
            try:
                return super().connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                           socket_options=socket_options)
            except httpcore.ConnectError as exc:  # try the name's next address
                failure = exc
        raise failure


class AsyncGuardedBackend(httpcore.AnyIOBackend):
    """``GuardedBackend`` for ``httpx.AsyncClient``: the name is resolved and checked in a worker thread
    (``getaddrinfo`` blocks), then the connection goes to a checked address."""

    def __init__(self, rules: Rules | None = None):
        self.rules = rules

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        connect = super().connect_tcp
        return await connect_checked(host, port, self.rules, lambda address: connect(
            address, port, timeout=timeout, local_address=local_address, socket_options=socket_options),
            httpcore.ConnectError)


async def connect_checked(host: str, port: int, rules: Rules | None, connect, connect_error: type[Exception]):
    """Resolve ``host`` and check its addresses (``checked_addresses`` under ``rules``, in a worker thread:
    ``getaddrinfo`` blocks), then ``await connect(address)`` for each checked address in turn until one
    connects; returns that connection.

    For any async HTTP stack's network backend (httpcore's here, httpcore2's for the MCP SDK:
    ``tools.mcp.client``). Raises ``UnsafeURL`` before any connection is tried, or the last address's
    ``connect_error``.
    """
    failure = None
    for address in await anyio.to_thread.run_sync(checked_addresses, host, port, rules):
        try:
            return await connect(address)
        except connect_error as exc:  # try the name's next address
            failure = exc
    raise failure


# Pools of the guarded clients: httpx builds its httpcore pool without a way to pass a
# network backend, so the clients below put in the same pool with the guarded backend.
POOL = {"max_connections": 50, "max_keepalive_connections": 20, "keepalive_expiry": 30.0}


def guarded_client(rules: Rules | None = None, **options) -> httpx.Client:
    """An ``httpx.Client`` whose every connection is opened by ``GuardedBackend(rules)``: no redirects, no
    proxies or certificates from the environment. ``options``: further ``httpx.Client`` arguments (headers...)."""
    transport = httpx.HTTPTransport(trust_env=False)
    transport._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(trust_env=False),
                                              network_backend=GuardedBackend(rules), **POOL)
    return httpx.Client(transport=transport, trust_env=False, follow_redirects=False, **options)


def guarded_async_client(rules: Rules | None = None, **options) -> httpx.AsyncClient:
    """``guarded_client`` for asyncio: an ``httpx.AsyncClient`` over ``AsyncGuardedBackend(rules)``. It belongs to
    the event loop it is first used on."""
    transport = httpx.AsyncHTTPTransport(trust_env=False)
    transport._pool = httpcore.AsyncConnectionPool(ssl_context=httpx.create_ssl_context(trust_env=False),
                                                   network_backend=AsyncGuardedBackend(rules), **POOL)
    return httpx.AsyncClient(transport=transport, trust_env=False, follow_redirects=False, **options)
