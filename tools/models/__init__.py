from tools.models.policy_lock import PolicyLock
from tools.models.tool_call import ToolCall, ToolCallStatus

__all__ = ["PolicyLock", "ToolCall", "ToolCallStatus"]
