"""ask_user: a question for the job's user, answered by a person instead of a worker.

The tool declares its question (`Tool.question`); the orchestrator asks it (an
`input_requested` event, the inbox, `clawq answer`, the API) and the answer is the call's
result. The job waits as long as it takes: once nothing else of its turn runs it is parked
and leaves memory, and the answer resumes it. No worker ever runs this call.
"""

from __future__ import annotations

from pydantic import Field

from broker.protocol import Group
from broker.stores.requests import Question
from workers.tool import SideEffect, Tool, ToolContext, ToolError, ToolInput, ToolResult


class AskUserInput(ToolInput):
    question: str = Field(min_length=1, max_length=2000, description="what to ask the user")
    choices: list[str] = Field(
        default_factory=list,
        max_length=20,
        description="the answers to pick from (empty: free text)",
    )
    multi: bool = Field(False, description="several choices may be picked")


class AskUser(Tool[AskUserInput]):
    name = "ask_user"
    description = (
        "Ask the user a question and wait for the answer (it may take hours: the job waits "
        "without cost). Give choices to have one picked (multi: several). Use it when you "
        "cannot go on without the user's decision, not for what you can find out yourself."
    )
    group = Group.messaging
    input_model = AskUserInput
    side_effect = SideEffect.read
    default_permission = "allow"

    def summary(self, args: AskUserInput) -> str:
        return f"ask_user({args.question[:60]})"

    def question(self, args: AskUserInput) -> Question | None:
        return Question(question=args.question, choices=args.choices, multi=args.multi)

    def run(self, args: AskUserInput, ctx: ToolContext) -> ToolResult:
        raise ToolError("ask_user is answered by a person through the orchestrator")
