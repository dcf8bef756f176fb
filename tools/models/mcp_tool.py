"""The cached tool listings of MCP servers (``tools.mcp.discovery``) and what happened to them."""

from django.conf import settings
from django.db import models
from django.utils.translation import gettext_lazy as _


class McpTool(models.Model):
    """One tool of a configured MCP server, as its server last listed it.

    ``description``, ``input_schema`` and ``annotations`` are the listing's
    (``annotations``: the MCP names, e.g. ``{"readOnlyHint": true}``);
    ``fingerprint`` is a SHA-256 over the three. The tool is offered to
    models and may be called only while it is ``listed`` and its
    ``fingerprint`` equals ``accepted_fingerprint``: the definition an
    operator accepted (the first listing is accepted as configured; a change
    waits for the admin's "accept" action). ``accepted_definition`` keeps
    that accepted definition, to show what changed.
    """

    server = models.CharField(_("server"), max_length=32)
    name = models.CharField(_("name"), max_length=128)
    description = models.TextField(_("description"), blank=True)
    input_schema = models.JSONField(_("input schema"), default=dict)
    annotations = models.JSONField(_("annotations"), default=dict, blank=True)
    fingerprint = models.CharField(_("fingerprint"), max_length=64)
    accepted_fingerprint = models.CharField(_("accepted fingerprint"), max_length=64, blank=True)
    accepted_definition = models.JSONField(_("accepted definition"), default=dict, blank=True)
    accepted_by = models.ForeignKey(settings.AUTH_USER_MODEL, verbose_name=_("accepted by"), null=True, blank=True,
                                    on_delete=models.SET_NULL, related_name="+")
    accepted_at = models.DateTimeField(_("accepted at"), null=True, blank=True)
    listed = models.BooleanField(_("listed"), default=True,
                                 help_text=_("Whether the server's last listing had this tool."))
    refreshed_at = models.DateTimeField(_("refreshed at"))
    approval_rule = models.CharField(
        _("approval rule"), max_length=500, blank=True,
        help_text=_("An operator's approval rule for this tool (e.g. always, never, amount > 50), replacing the "
                    "settings' rule and the one its annotations give; empty: those."))

    class Meta:
        verbose_name = _("MCP tool")
        verbose_name_plural = _("MCP tools")
        constraints = [models.UniqueConstraint(fields=["server", "name"], name="mcp_tool_unique_name")]
        ordering = ["server", "name"]

    def __str__(self):
        return self.full_name

    @property
    def full_name(self) -> str:
        """The name agents and models use: ``server.tool``."""
        return f"{self.server}.{self.name}"

    @property
    def held(self) -> bool:
        """Listed, but its definition changed since an operator accepted it: refused until accepted again."""
        return self.listed and self.fingerprint != self.accepted_fingerprint

    def definition(self) -> dict:
        """The listed definition: ``{"description", "inputSchema", "annotations"}``."""
        return {"description": self.description, "inputSchema": self.input_schema, "annotations": self.annotations}


class McpToolEvent(models.Model):
    """Something that happened to an MCP tool's definition: the audit trail operators read.

    ``kind``: ``discovered``, ``changed`` (held until accepted), ``accepted``,
    ``removed`` (no longer listed), ``returned`` (listed again) or ``rule``
    (an operator set its approval rule).
    ``detail``: ``{"before", "after"}`` definitions (rules, for ``rule``) where they apply.
    """

    class Kind(models.TextChoices):
        DISCOVERED = "discovered", _("discovered")
        CHANGED = "changed", _("changed")
        ACCEPTED = "accepted", _("accepted")
        REMOVED = "removed", _("removed")
        RETURNED = "returned", _("returned")
        RULE = "rule", _("approval rule set")

    tool = models.ForeignKey(McpTool, verbose_name=_("tool"), on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(_("kind"), max_length=16, choices=Kind.choices)
    actor = models.CharField(_("actor"), max_length=150)
    detail = models.JSONField(_("detail"), default=dict, blank=True)
    created_at = models.DateTimeField(_("created at"), auto_now_add=True)

    class Meta:
        verbose_name = _("MCP tool event")
        verbose_name_plural = _("MCP tool events")
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.tool}: {self.kind}"
