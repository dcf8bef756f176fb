"""Model providers: turn a context into a final answer or tool calls.

``get_client(config)`` picks the provider named by ``config["provider"]``;
the providers are listed in ``runs.providers.registry``.
"""

from runs.base.model_call import ModelClient, ModelError, ModelRequest, ModelResponse
from runs.providers.registry import get_client

__all__ = ["ModelClient", "ModelError", "ModelRequest", "ModelResponse", "get_client"]
