from tools.models.mcp_tool import McpTool, McpToolEvent
from tools.models.policy_lock import PolicyLock
from tools.models.tool_call import ToolCall, ToolCallStatus
from tools.models.wait import ExternalEvent, Wait, WaitStatus

__all__ = ["ExternalEvent", "McpTool", "McpToolEvent", "PolicyLock", "ToolCall", "ToolCallStatus", "Wait", "WaitStatus"]
