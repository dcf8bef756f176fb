from tools.models.shop import Order
from tools.models.tool_call import ToolCall, ToolCallStatus

__all__ = ["Order", "ToolCall", "ToolCallStatus"]
