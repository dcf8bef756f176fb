"""The one list of model providers, and the two things asked of it: check a config, make a client.

A provider is one module that declares ``PROVIDER = Provider(name, config_problems,
client)`` (``runs.base.model_call.Provider``); adding one is that module plus its
line in ``PROVIDER_MODULES``. Modules are imported on first use, so a worker that
only runs scripted agents never loads a vendor SDK. Agent creation (API, admin)
calls ``model_config_problems``; the loop calls ``get_client``.
"""

import importlib

from django.core.exceptions import ImproperlyConfigured
from django.utils.translation import gettext as _

from runs.base.model_call import ConfigError, ModelClient, Provider

# provider name -> the module that declares it (its ``PROVIDER``).
PROVIDER_MODULES: dict[str, str] = {
    "scripted": "runs.providers.scripted",
    "openai": "runs.providers.openai_provider",
    "anthropic": "runs.providers.anthropic_provider",
}
# What a stored config without "provider" runs with (agent creation asks for the name).
DEFAULT_PROVIDER = "scripted"


def register_provider(name: str, module: str) -> None:
    """List the provider ``name``, declared by ``module`` (dotted path), e.g. from a plug-in's ``AppConfig.ready``.

    Raises ``ImproperlyConfigured`` if ``name`` is already listed for another module.
    """
    if PROVIDER_MODULES.get(name, module) != module:
        raise ImproperlyConfigured(f"Model provider {name!r} is already declared by {PROVIDER_MODULES[name]}.")
    PROVIDER_MODULES[name] = module


def unknown_provider_message(name) -> str:
    """The message for a provider name nobody declared, listing the known ones."""
    return _("Unknown model provider %(provider)s; known: %(known)s.") % {
        "provider": repr(name), "known": ", ".join(PROVIDER_MODULES)}


def get_provider(name: str) -> Provider:
    """The ``Provider`` declared as ``name``. Raises ``ConfigError`` for an unknown name and
    ``ImproperlyConfigured`` when the listed module declares another name."""
    if not isinstance(name, str) or name not in PROVIDER_MODULES:
        raise ConfigError(unknown_provider_message(name))
    provider = importlib.import_module(PROVIDER_MODULES[name]).PROVIDER
    if provider.name != name:
        raise ImproperlyConfigured(f"{PROVIDER_MODULES[name]} declares provider {provider.name!r}, listed as {name!r}.")
    return provider


def model_config_problems(config) -> list[str]:
    """Messages for everything wrong with an agent's ``model`` config (empty: usable); checked before saving.

    ``config`` must be an object naming a listed ``provider``; the rest is
    that provider's ``config_problems``.
    """
    if not isinstance(config, dict):
        return [_("The model config must be an object with a 'provider'.")]
    try:
        provider = get_provider(config.get("provider"))
    except ConfigError as exc:
        return [str(exc)]
    return provider.config_problems(config)


def get_client(config: dict) -> ModelClient:
    """The client for an agent's ``model`` config (``DEFAULT_PROVIDER`` when it names none). Raises ``ConfigError``."""
    config = config or {}
    return get_provider(config.get("provider", DEFAULT_PROVIDER)).client(config)
