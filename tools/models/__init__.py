from tools.models.mcp_tool import McpTool, McpToolEvent
from tools.models.policy_lock import PolicyLock
from tools.models.tool_call import ToolCall, ToolCallStatus

__all__ = ["McpTool", "McpToolEvent", "PolicyLock", "ToolCall", "ToolCallStatus"]
