"""``manage.py mcp_refresh [server ...]``: list the tools of MCP servers now and update their cache."""

from django.core.management.base import BaseCommand, CommandError

from tools.mcp.conf import servers
from tools.mcp.discovery import refresh
from tools.registry import ToolError


class Command(BaseCommand):
    help = ("List the tools of the MCP servers in TOLLGATE_MCP_SERVERS (all, or those named) and update their "
            "cache; a tool whose definition changed is held until an operator accepts it in the admin.")

    def add_arguments(self, parser):
        parser.add_argument("servers", nargs="*", help="server names (default: every configured server)")

    def handle(self, *args, **options):
        configured = servers()
        names = options["servers"] or sorted(configured)
        unknown = [name for name in names if name not in configured]
        if unknown:
            raise CommandError(f"Not configured in TOLLGATE_MCP_SERVERS: {', '.join(unknown)}.")
        failed = []
        for name in names:
            try:
                refreshed = refresh(name, actor="mcp_refresh")
            except ToolError as exc:  # ToolUnavailable included: the cache is left as it was
                self.stderr.write(f"{name}: {exc}")
                failed.append(name)
                continue
            for tool, kind in refreshed.changes:
                self.stdout.write(f"{tool}: {kind}")
            self.stdout.write(f"{name}: refreshed, {len(refreshed.changes)} change(s).")
        if failed:
            raise CommandError(f"Could not list: {', '.join(failed)}.")
