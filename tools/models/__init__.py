from tools.models.policy_lock import PolicyLock
from tools.models.shop import Order
from tools.models.tool_call import ToolCall, ToolCallStatus

__all__ = ["Order", "PolicyLock", "ToolCall", "ToolCallStatus"]
