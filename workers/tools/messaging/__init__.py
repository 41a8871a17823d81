"""messaging: `message` to the configured channels (webhook, Slack, Telegram, email)."""

from workers.tools.messaging.tool import TOOLS

__all__ = ["TOOLS"]
