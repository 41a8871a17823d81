"""A message channel as the settings describe it (`CLAWQ_MESSAGE_CHANNELS`, name → channel):
where `message` sends, where a job's requests are asked, and where its answer is written
live (`live_answers`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class MessageChannel(BaseModel):
    """One channel `message` can send to. `kind` decides which fields matter:
    webhook: `url` (+ `secret_env` for the HMAC-SHA256 signature);
    slack: `url` (an incoming webhook) or `token_env` (chat.postMessage at `api_base`),
    `secret_env` the signing secret of its interactivity webhook;
    telegram: `token_env` (the Bot API at `api_base`), `secret_env` its webhook's secret;
    email: `host`, `port`, `username`, `password_env`, `sender`, `starttls`."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["webhook", "slack", "telegram", "email"]
    url: str = ""
    api_base: str = ""  # '': the provider's (https://slack.com/api, https://api.telegram.org)
    token_env: str = ""
    secret_env: str = ""
    host: str = ""
    port: int = Field(587, ge=1, le=65535)
    username: str = ""
    password_env: str = ""
    sender: str = ""
    starttls: bool = True
    ca_file: str = ""  # email: a CA bundle to trust (a private mail server); '': the system's
    default_target: str = ""  # a chat, a Slack channel, an address
    # answers from the chat (slack, telegram): the inbound webhook's secret is `secret_env`
    # (Slack's signing secret; Telegram's setWebhook secret_token); who may answer is the
    # job's user, by the identity mapped here, or an admin's identity
    users: dict[str, str] = Field(
        default_factory=dict, description="a chat identity (Slack or Telegram user id) → user"
    )
    admins: list[str] = Field(default_factory=list, description="chat identities of admins")
    # a job that came from a chat of this channel has its answer written there as it comes:
    # a message sent with the first text, edited as more comes, replaced by the final text
    live_answers: bool = Field(False, description="telegram, or slack with token_env")
    live_interval_s: float = Field(
        0.0, ge=0, description="between requests to one chat; 0: CLAWQ_CHAT_PREVIEW_INTERVAL_S"
    )

    @field_validator("token_env", "secret_env", "password_env")
    @classmethod
    def _not_ours(cls, name: str) -> str:
        if name.upper().startswith("CLAWQ_"):
            raise ValueError(f"{name} is one of clawq's own settings, not a channel's secret")
        return name

    @model_validator(mode="after")
    def _live_where_editable(self) -> MessageChannel:
        """A live answer is a message edited in place: only where a sent message can be."""
        if self.live_answers and not self.edits_messages:
            raise ValueError(
                f"live_answers needs a channel that edits its messages (telegram, or slack "
                f"with token_env); a {self.kind} channel"
                + (" with an incoming webhook" if self.kind == "slack" else "")
                + " cannot"
            )
        return self

    @property
    def edits_messages(self) -> bool:
        """Whether a message sent here has an id to edit by (chat.update, editMessageText)."""
        return self.kind == "telegram" or (self.kind == "slack" and bool(self.token_env))
