"""messaging: `message` to the configured channels (webhook, Slack, Telegram, email), and
`ask_user`, a question a person answers."""

from typing import Any

from workers.tool import Tool
from workers.tools.messaging.ask_user import AskUser
from workers.tools.messaging.tool import TOOLS as MESSAGE_TOOLS

TOOLS: list[type[Tool[Any]]] = [*MESSAGE_TOOLS, AskUser]

__all__ = ["TOOLS"]
