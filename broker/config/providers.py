"""The settings of model providers: their endpoints and credentials, failover (retries,
cool-downs) and each model's context window (when older turns are compacted)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# context windows by model family: the longest prefix of a model's name that is listed
CONTEXT_WINDOWS: dict[str, int] = {
    "claude": 200_000,
    "gpt-3.5": 16_385,
    "gpt-4": 8_192,
    "gpt-4-turbo": 128_000,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4": 200_000,
    "scripted": 200_000,
}


class ModelCredential(BaseModel):
    """One API key of a provider, named by a label (what events and logs show) and read
    from the environment variable `api_key_env` (never written in configuration)."""

    model_config = ConfigDict(extra="forbid")

    provider: Literal["openai", "anthropic"]
    label: str = Field(pattern=r"^[A-Za-z0-9_.:@-]{1,64}$")
    api_key_env: str = Field(min_length=1)
    base_url: str = Field("", description="'': the provider's (openai_base_url, …)")
    agents: list[str] = Field(default_factory=list, description="only these agents; []: any")

    @field_validator("api_key_env")
    @classmethod
    def _not_ours(cls, name: str) -> str:
        if name.upper().startswith("CLAWQ_"):
            raise ValueError(f"{name} is one of clawq's own settings, not a provider's key")
        return name


class Providers(BaseModel):
    # model providers
    openai_base_url: str = "https://api.openai.com/v1"
    openai_api_key: str = ""
    openai_model: str = "gpt-4o-mini"
    anthropic_base_url: str = "https://api.anthropic.com"
    anthropic_api_key: str = ""
    anthropic_model: str = "claude-sonnet-4-5"
    anthropic_max_tokens: int = 4096
    model_timeout_s: float = 120.0
    model_connections: int = Field(
        2000,
        ge=1,
        description="connections an orchestrator holds open to model providers, all kept "
        "alive; a request beyond waits for one (as many as its jobs: each asks one at a time)",
    )
    # failover: a job's model may be a chain (`anthropic:m1,openai:m2`), tried in order
    model_credentials: list[ModelCredential] = Field(
        default_factory=list,
        description="tried in this order for their provider; none for a provider: its "
        "<provider>_api_key, labelled 'default'",
    )
    model_retry_attempts: int = Field(3, ge=1, description="per credential, then the next")
    model_retry_initial_s: float = Field(0.5, ge=0, description="first backoff, then doubled")
    model_retry_max_s: float = Field(8.0, ge=0, description="longest backoff (plus jitter)")
    model_retry_after_max_s: float = Field(
        30.0, ge=0, description="a longer retry-after moves to the next credential at once"
    )
    model_cooldown_s: float = Field(
        60.0,
        gt=0,
        description="a credential that got 429 rests this long, cluster-wide, "
        "unless its retry-after says otherwise",
    )
    model_cooldown_wait_max_s: float = Field(
        60.0, ge=0, description="every credential resting: wait this long at most for one"
    )


class ModelStreaming(BaseModel):
    # output as it arrives: the model's text (`model_delta`) and a command's
    # (`tool_output_delta`), coalesced
    stream_model_deltas: bool = Field(
        True,
        description="false: no model_delta events (the reply still streams from the "
        "provider; its text comes whole in model_text)",
    )
    stream_delta_interval_ms: int = Field(
        50, ge=0, description="text waits at most this long to be sent as one model_delta"
    )
    stream_delta_max_chars: int = Field(
        200, ge=1, description="a model_delta is sent at once when this much text waits"
    )
    tool_output_stream_max_bytes: int = Field(
        65_536,
        ge=0,
        description="of a command's output (exec, custom tools, on the host or in the "
        "sandbox; a background process's), sent as tool_output_delta events while it "
        "runs, per call (0: none)",
    )


class ModelContext(BaseModel):
    # the context a model is sent: compaction of older turns, long tool results cut
    model_context_windows: dict[str, int] = Field(
        default_factory=lambda: dict(CONTEXT_WINDOWS),
        description="model name prefix → context window in tokens (the longest prefix wins)",
    )
    model_context_window_default: int = Field(128_000, ge=1000, description="a model unlisted")
    context_compact_at: float = Field(
        0.8, gt=0, le=1, description="share of the window that a request may fill"
    )
    context_keep_recent: float = Field(
        0.25, gt=0, lt=1, description="share of the window kept verbatim when compacting"
    )
    context_compact_model: str = Field(
        "", description="the model (or chain) that writes summaries; '': the job's own"
    )
    context_summary_max_chars: int = Field(
        8000, ge=200, description="a summary is cut at this length"
    )
    context_chars_per_token: float = Field(
        3.5, gt=0, description="estimate until a provider reports what a request counted"
    )
    tool_result_context_chars: int = Field(
        20_000, ge=200, description="a longer tool result is cut in the context, with a pointer"
    )
