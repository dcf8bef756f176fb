"""The MCP server profiles checked when Django starts (``tools.apps``): shapes, secrets and URL rules.

The URL rules of webhooks apply to MCP servers (``runs.webhooks.urlguard``;
each connection is checked again: ``tools.mcp.client``), so a profile
pointing at loopback, a private network or a metadata address is refused unless ``TOLLGATE_WEBHOOK_ALLOWED_HOSTS``
(or ``..._ALLOW_PRIVATE_NETWORKS``) allows it, and plain ``http://`` needs
``TOLLGATE_WEBHOOK_ALLOW_HTTP``.
"""

import importlib.util

from django.core.exceptions import ImproperlyConfigured

from runs.webhooks.urlguard import UnsafeURL, check_url
from tools.mcp.conf import servers


def check_servers() -> None:
    """Raise ``ImproperlyConfigured`` naming the server and the problem for any profile that cannot be used:
    malformed (``tools.mcp.conf``), its auth header's variable unset, or its URL refused. The secret's value
    is never part of a message."""
    if servers() and importlib.util.find_spec("mcp") is None:
        raise ImproperlyConfigured("TOLLGATE_MCP_SERVERS names servers, but the MCP SDK is not installed: "
                                   "pip install 'tollgate[mcp]'.")
    for profile in servers().values():
        profile.headers()
        try:
            check_url(profile.url)
        except UnsafeURL as exc:
            raise ImproperlyConfigured(f"TOLLGATE_MCP_SERVERS: server {profile.name!r}: {exc.message}") from None
