"""A model provider that exists only in the tests: one file, as a real provider would be.

Config: ``{"provider": "echo", "reply": str}``. Every call answers ``reply``
followed by the last message it was sent, in brackets (so a test sees that
the run's context reached it).
"""

from runs.base.model_call import ModelRequest, ModelResponse, Provider

KNOWN_KEYS = {"provider", "reply"}


def config_problems(config: dict) -> list[str]:
    """``reply`` must be a string; no other keys."""
    problems = []
    unknown = sorted(str(key) for key in set(config) - KNOWN_KEYS)
    if unknown:
        problems.append(f"Unknown key(s) in the echo model config: {', '.join(unknown)}.")
    if not isinstance(config.get("reply"), str):
        problems.append("The echo model config needs a 'reply' string.")
    return problems


class EchoClient:
    """Answers every call with the config's ``reply`` and the last message's text, at once."""

    timeout_s = 1.0

    def __init__(self, config: dict):
        self.reply = config["reply"]

    async def complete(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(content=f"{self.reply} [{request.messages[-1]['content']}]")


PROVIDER = Provider(name="echo", config_problems=config_problems, client=EchoClient)
