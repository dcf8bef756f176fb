from tools.models.shop import GatewayRefund, Order
from tools.models.tool_call import ToolCall, ToolCallStatus

__all__ = ["GatewayRefund", "Order", "ToolCall", "ToolCallStatus"]
