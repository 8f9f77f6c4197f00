"""Models: the interface, offline doubles, and the OpenAI-compatible adapter."""

from teamrt.models.base import (
    ChatMessage,
    Model,
    ModelReply,
    StreamingModel,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
    allow_model_requests,
    model_requests_allowed,
    set_model_requests_allowed,
)
from teamrt.models.offline import FunctionModel, ScriptedModel, call, calls, reply
from teamrt.models.openai_model import OpenAIModel

__all__ = [
    "ChatMessage",
    "FunctionModel",
    "Model",
    "ModelReply",
    "OpenAIModel",
    "ScriptedModel",
    "StreamingModel",
    "TextDelta",
    "ToolCall",
    "ToolSpec",
    "Usage",
    "allow_model_requests",
    "call",
    "calls",
    "model_requests_allowed",
    "reply",
    "set_model_requests_allowed",
]
