"""Models: the interface, offline doubles, and the OpenAI-compatible adapter.

`OpenAIModel` is imported on first use (`teamrt.models.OpenAIModel`), so the OpenAI SDK, which
takes most of a second to import, is loaded only by a program that makes an OpenAI model."""

from typing import TYPE_CHECKING, Any

from teamrt.models.base import (
    ChatMessage,
    Model,
    ModelReply,
    OutputSpec,
    StreamingModel,
    StructuredOutputModel,
    StructuredStreamingModel,
    TextDelta,
    ToolCall,
    ToolSpec,
    Usage,
    allow_model_requests,
    model_requests_allowed,
    set_model_requests_allowed,
)
from teamrt.models.offline import FunctionModel, ScriptedModel, call, calls, reply

if TYPE_CHECKING:
    from teamrt.models.openai_model import OpenAIModel


def __getattr__(name: str) -> Any:
    if name == "OpenAIModel":
        from teamrt.models.openai_model import OpenAIModel

        return OpenAIModel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ChatMessage",
    "FunctionModel",
    "Model",
    "ModelReply",
    "OpenAIModel",
    "OutputSpec",
    "ScriptedModel",
    "StreamingModel",
    "StructuredOutputModel",
    "StructuredStreamingModel",
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
