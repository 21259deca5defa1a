"""``ask_user``: pause the run until the user answers a question (human in the loop)."""

from __future__ import annotations

from typing import Any

from capabilities.builtin.registration import register_builtin
from capabilities.tools import QuestionForUser, Tool, ToolContext, ToolError, ToolResult
from llm.types import ToolSpec

MAX_QUESTION_CHARS = 2_000

DESCRIPTION = """Ask the user a question and wait for the answer.

Use it when you cannot go on without information or a decision only the user has. The run
pauses until the user replies; the reply is this tool's result. Ask one clear question."""


@register_builtin("ask_user")
class AskUserTool(Tool):
    spec = ToolSpec(
        name="ask_user",
        description=DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {"question": {"type": "string", "description": "The question, ≤ 2000 characters."}},
            "required": ["question"],
        },
    )

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult:
        question = arguments.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ToolError("`question` must be a non-empty string.", code="invalid_arguments")
        raise QuestionForUser(question.strip()[:MAX_QUESTION_CHARS])
