"""The sections of the settings, one model each; `Settings` (settings.py) inherits them
all, so each field is still `CLAWQ_<NAME>` in the environment."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from broker.config.channels import MessageChannel
from broker.config.policy import Ceiling, HooksConfig, PermissionRules, ToolPolicy
from broker.stores.context_files import CONTEXT_FILES

TtsProvider = Literal["espeak", "openai", "elevenlabs", "edge"]


class ImageEndpoint(BaseModel):
    """An OpenAI-compatible images API (`POST {base_url}/images/generations`)."""

    model_config = ConfigDict(extra="forbid")

    base_url: str
    api_key_env: str = ""
    model: str = "gpt-image-1"


class Connections(BaseModel):
    redis_url: str = "redis://127.0.0.1:6379/0"
    database_url: str = "postgresql://postgres@127.0.0.1:5432/postgres"
    redis_max_connections: int = Field(64, ge=2, description="per asyncio process")
    database_pool_size: int = Field(10, ge=1, description="per orchestrator process")


class AgentLoop(BaseModel):
    # agent loop
    max_iterations: int = Field(20, ge=1, description="model turns per job before max_iterations")
    max_parallel_calls: int = Field(10, ge=1, description="concurrency-safe calls run at once")
    exec_error_cascade: bool = Field(True, description="a failed exec stops its batch siblings")
    steer_settle_s: float = Field(0.5, ge=0, description="pause between stopping and steering")
    results_write_delay_s: float = Field(
        0.5,
        ge=0,
        description="a turn's tool results wait up to this long to be written in one statement "
        "with the model's next message (the ledger holds them meanwhile)",
    )
    turn_check_s: float = Field(
        1.0,
        ge=0,
        description="a turn starts on the control channel's word (a cancel or steer is pushed) "
        "and reads the job's cancel flag and inbox in Redis at least this often: a push lost "
        "with its connection is seen within it (0: every turn reads them)",
    )
    max_jobs_per_orchestrator: int = Field(2000, ge=1)
    loop_repeat_warn: int = Field(
        3,
        ge=0,
        description="the same call in this many turns in a row: the model is warned; "
        "twice as many: the job stops, looping (0: off)",
    )


class ToolCalls(BaseModel):
    # tool calls
    exec_timeout_s: float = Field(60.0, gt=0, description="exec on the host")
    exec_max_timeout_s: float = Field(600.0, gt=0, description="cap of a per-call timeout")
    exec_output_cap_bytes: int = Field(1024 * 1024, ge=1024, description="per stream")
    read_max_bytes: int = Field(256 * 1024, ge=1024, description="read_file page size cap")
    read_default_lines: int = Field(2000, ge=1)
    search_max_results: int = Field(200, ge=1)
    list_max_entries: int = Field(1000, ge=1)
    list_cache_s: float = Field(
        60.0,
        ge=0,
        description="a worker answers a listing of routed files (context files, memory) from "
        "memory this long at most, each answer checked against the agent's write token with "
        "the call's claim; a change made around clawq (SQL by hand) shows within it (0: off)",
    )
    tool_grace_s: float = Field(5.0, ge=0, description="hard time limit beyond a tool's timeout")
    max_deliveries: int = Field(3, ge=1, description="times a call may start before it fails")
    heartbeat_interval_s: float = Field(1.0, gt=0)
    heartbeat_ttl_s: float = Field(4.0, gt=0, description="a process silent this long is dead")
    orchestrator_stall_s: float = Field(
        30.0, gt=0, description="an orchestrator's event loop silent this long gives up its jobs"
    )
    ledger_ttl_s: int = Field(7 * 24 * 3600, ge=60, description="hot ledger entries in Redis")
    events_ttl_s: int = Field(7 * 24 * 3600, ge=60, description="job event streams in Redis")
    visibility_timeout_s: int = Field(3600, ge=60, description="above the longest hard limit")
    outage_retry_s: float = Field(
        600.0,
        gt=0,
        description="what must be recorded (a worker's outcome, a job's events and results) is "
        "retried this long while Redis or PostgreSQL is away; then a worker spools it and a "
        "job pauses for recovery",
    )
    spool_dir: str = Field(
        default_factory=lambda: str(Path.home() / ".clawq" / "spool"),
        description="outcomes a worker could not record, replayed when Redis answers again "
        "(by any worker process of the host: keep it across restarts)",
    )


class Permissions(BaseModel):
    # what the model may call (JSON in the environment)
    tool_policy: ToolPolicy = Field(default_factory=ToolPolicy)
    permissions: PermissionRules = Field(
        default_factory=PermissionRules, description="managed rules: the highest source"
    )
    agent_permissions: dict[str, PermissionRules] = Field(default_factory=dict)
    user_permissions: dict[str, PermissionRules] = Field(default_factory=dict)
    # tenancy: what each user's jobs may ask for ("*": every user not named)
    user_ceilings: dict[str, Ceiling] = Field(
        default_factory=dict, description="per user (admin-set); '*' the default"
    )
    workspace_root: str = Field(
        "/var/lib/clawq/workspaces", description="a user's workspaces lie under <root>/<user>"
    )
    hooks: HooksConfig = Field(default_factory=HooksConfig)
    approval_timeout_s: float = Field(
        0.0, ge=0, description="a person's request waits this long; 0: as long as it takes"
    )
    approval_on_timeout: Literal["deny", "cancel"] = Field(
        "deny", description="an unanswered request's end: its call denied, or the job cancelled"
    )
    agent_approval_timeout_s: dict[str, float] = Field(
        default_factory=dict, description="per agent, over approval_timeout_s"
    )
    park_after_s: float = Field(
        10.0, ge=0, description="a job waiting only for people leaves memory after this"
    )
    # exec approvals (goclaw §4): which commands run, and when a person is asked
    exec_security: Literal["deny", "allowlist", "full"] = "allowlist"
    exec_ask: Literal["off", "on-miss", "always"] = "on-miss"
    exec_allowlist: list[str] = Field(
        default_factory=list, description="command patterns, each judged per sub-command"
    )
    rate_limit_per_hour: int = Field(150, ge=0, description="tool calls per session; 0: off")


class Subagents(BaseModel):
    # subagents (goclaw §6)
    max_spawn_depth: int = Field(1, ge=0, description="subagent nesting depth")
    max_concurrent_subagents: int = Field(8, ge=1, description="running across the cluster")
    max_children_per_agent: int = Field(5, ge=1, description="finished ones count until archived")
    subagent_max_iterations: int = Field(20, ge=1, description="model turns per subagent")
    subagent_archive_after_s: float = Field(3600.0, gt=0, description="finished → archived")
    subagent_lease_s: float = Field(10.0, gt=0, description="a silent child's slot is freed")
    subagent_queue_lease_s: float = Field(120.0, gt=0, description="slot of a queued child")
    subagent_run_timeout_s: float = Field(900.0, gt=0, description="a sync spawn waits this long")
    subagent_steer_settle_s: float = Field(0.5, ge=0, description="between cancel and respawn")
    subagent_steer_max_bytes: int = Field(4000, ge=1, description="steer message cut")
    announce_debounce_s: float = Field(1.0, ge=0, description="reset by each new arrival")
    announce_drain_at: int = Field(20, ge=1, description="a batch this big is due at once")
    agent_task_events: bool = Field(
        True, description="Celery events for agent runs (Flower): a few per job, not per call"
    )


class Mcp(BaseModel):
    # the MCP bridge (goclaw §7)
    mcp_call_timeout_s: float = Field(60.0, gt=0, description="idle limit; progress resets it")
    mcp_call_total_s: float = Field(600.0, gt=0, description="a call's total; a server's ceiling")
    mcp_health_interval_s: float = Field(30.0, gt=0, description="ping or list each server")
    mcp_reconnect_initial_s: float = Field(2.0, gt=0, description="first backoff, then doubled")
    mcp_reconnect_max_s: float = Field(60.0, gt=0, description="longest backoff")
    mcp_reconnect_attempts: int = Field(10, ge=1, description="then the server is failed")
    mcp_output_cap_chars: int = Field(100_000, ge=1000, description="of one result")
    mcp_elicitation_timeout_s: float = Field(
        300.0,
        gt=0,
        description="a server's question to a person waits this long (or the call's rest)",
    )


class Confinement(BaseModel):
    # confinement of host commands (workers/confine/host.py); the Docker sandbox is stronger
    exec_confinement: Literal["auto", "bwrap", "none"] = Field(
        "auto", description="auto: bubblewrap where it works, else unconfined with a warning"
    )
    exec_bwrap_path: str = Field("bwrap", description="the bubblewrap binary")
    exec_network: bool = Field(
        False, description="confined commands get the host's network (else an allow rule)"
    )
    exec_hidden_paths: list[str] = Field(
        default_factory=lambda: [
            "/root",
            "/home",
            "/run",
            "/var/run",
            "/etc/shadow",
            "/etc/gshadow",
            "/etc/ssh",
            "/etc/clawq",
            "/var/lib/postgresql",
            "/var/lib/redis",
            "/var/lib/mysql",
            "/var/lib/rabbitmq",
            "/var/lib/docker",
            "/var/lib/containers",
        ],
        description="hidden from confined commands, with the worker's home and clawq's state",
    )


class Sandbox(BaseModel):
    # the Docker sandbox for exec (off: commands run on the worker's host)
    sandbox_enabled: bool = False
    sandbox_docker_url: str = Field("", description="Docker API; empty: DOCKER_HOST or the default")
    sandbox_image: str = "clawq-sandbox:latest"
    sandbox_scope: Literal["session", "agent"] = "session"
    sandbox_network: str = Field("none", description="Docker network mode; none: no network")
    sandbox_memory: str = "512m"
    sandbox_cpus: float = Field(1.0, gt=0)
    sandbox_pids: int = Field(256, ge=16)
    sandbox_user: str = Field("", description="uid:gid; empty: the workspace owner (not root)")
    sandbox_idle_s: float = Field(600.0, gt=0, description="idle containers are removed")
    exec_sandbox_timeout_s: float = Field(300.0, gt=0, description="exec in the sandbox")


class Egress(BaseModel):
    # the web group and every other outbound request (workers/egress/client.py, netguard.py)
    web_allow_domains: list[str] = Field(
        default_factory=list, description="only these (example.com, *.example.com); empty: any"
    )
    web_block_domains: list[str] = Field(default_factory=list, description="never these")
    web_private_allow: list[str] = Field(
        default_factory=list, description="CIDRs or address:port exempt from the private block"
    )
    web_allow_fake_ip_range: bool = Field(
        False, description="allow 198.18.0.0/15, which fake-IP proxies hand out"
    )
    web_proxy: str = Field("", description="send every outbound request through this proxy")
    web_max_redirects: int = Field(3, ge=0)
    web_max_url_chars: int = Field(2000, ge=32)
    web_max_body_bytes: int = Field(5 * 1024 * 1024, ge=1024, description="after decompression")
    web_connect_timeout_s: float = Field(10.0, gt=0)
    web_read_timeout_s: float = Field(20.0, gt=0)
    web_fetch_max_chars: int = Field(100_000, ge=100, description="cap of web_fetch max_chars")
    web_cache_ttl_s: int = Field(900, ge=0, description="web_fetch and web_search cache; 0: off")
    web_worker_concurrency: int = Field(100, ge=1, description="threads of a web worker")
    web_search_providers: list[str] = Field(
        default_factory=list,
        description="order of brave, tavily, searxng, duckduckgo; empty: every configured one",
    )
    brave_api_key: str = ""
    brave_base_url: str = "https://api.search.brave.com"
    tavily_api_key: str = ""
    tavily_base_url: str = "https://api.tavily.com"
    searxng_url: str = Field("", description="a SearXNG instance (JSON output enabled)")
    duckduckgo_url: str = "https://html.duckduckgo.com/html/"
    web_search_quota_per_day: dict[str, int] = Field(
        default_factory=dict, description="provider → searches a day, across all workers"
    )
    web_search_breaker_failures: int = Field(3, ge=1, description="in a row, then skipped")
    web_search_breaker_cooldown_s: float = Field(60.0, gt=0)


class Secrets(BaseModel):
    # secrets at rest (custom tools' env): AES-256-GCM, base64 keys of 32 bytes
    secret_key: str = Field("", description="the current key; `clawq secret-key` makes one")
    secret_key_id: str = Field("k1", pattern=r"^[A-Za-z0-9_.-]{1,32}$")
    secret_keys_retired: dict[str, str] = Field(
        default_factory=dict, description="key id → key, to open what older keys sealed"
    )


class CustomTools(BaseModel):
    # custom tools (goclaw §8): shell templates defined at run time, run on runtime workers
    custom_tool_max_timeout_s: int = Field(600, ge=1)


class Api(BaseModel):
    # the HTTP API (`clawq api`)
    api_host: str = "127.0.0.1"
    api_port: int = Field(8420, ge=1, le=65535)
    api_tls_certfile: str = ""
    api_tls_keyfile: str = ""
    api_behind_tls_proxy: bool = Field(
        False, description="a proxy in front terminates TLS: serve plain HTTP off loopback"
    )
    api_cors_origins: list[str] = Field(default_factory=list, description="none: no CORS")
    api_rate_limit_per_minute: int = Field(600, ge=0, description="requests per key; 0: off")
    api_max_running_jobs: int = Field(20, ge=1, description="jobs per key running at once")
    api_sse_keepalive_s: float = Field(15.0, gt=0)


class ContextFiles(BaseModel):
    # context files (SOUL.md, …) in the system prompt: this order, each cut at a cap
    context_prompt_files: list[str] = Field(
        default_factory=lambda: list(CONTEXT_FILES),
        description="context files put in a job's system prompt, in this order",
    )
    context_file_max_chars: int = Field(20_000, ge=100, description="per file in the prompt")
    context_prompt_max_chars: int = Field(150_000, ge=100, description="all files together")


class Memory(BaseModel):
    # memory (MEMORY.md, memory/**) and memory_search
    memory_embedder: Literal["auto", "openai", "local", "none"] = Field(
        "auto", description="auto: openai when its URL is set, else local when installed"
    )
    memory_openai_url: str = Field(
        "", description="an OpenAI-compatible API base, e.g. https://api.openai.com/v1"
    )
    memory_openai_api_key: str = ""
    memory_openai_model: str = "text-embedding-3-small"
    memory_openai_dimensions: int | None = Field(None, ge=1)
    memory_chunk_tokens: int = Field(400, ge=16)
    memory_chunk_overlap_tokens: int = Field(80, ge=0)
    memory_max_results: int = Field(6, ge=1, le=50)
    memory_snippet_chars: int = Field(700, ge=50)
    memory_vector_weight: float = Field(0.7, ge=0)
    memory_text_weight: float = Field(0.3, ge=0)
    memory_candidate_multiplier: int = Field(4, ge=1)
    memory_max_document_bytes: int = Field(1024 * 1024, ge=1024)
    memory_index_retry_s: float = Field(30.0, gt=0, description="first retry; doubles")
    memory_outbox_sweep_s: float = Field(30.0, gt=0, description="how often lost tasks resend")
    memory_index_timeout_s: float = Field(600.0, gt=0, description="one document's indexing")


class Artifacts(BaseModel):
    # artifacts: binary results (screenshots, PDFs, downloads), stored once by content hash
    artifact_store: Literal["postgres", "files"] = "postgres"
    artifact_dir: str = Field(
        "/var/lib/clawq/artifacts",
        description="the files store: one directory every process shares",
    )
    artifact_retention_s: int = Field(7 * 24 * 3600, ge=60)
    artifact_max_bytes: int = Field(50 * 1024 * 1024, ge=1024)


class Replays(BaseModel):
    # replays, forks and evals of recorded jobs (issue 34)
    checkpoints: bool = Field(
        True, description="write_file and edit_file keep the prior version (forks restore it)"
    )
    checkpoint_retention_s: int = Field(
        30 * 24 * 3600, ge=60, description="how long a prior version is kept"
    )
    checkpoint_max_bytes: int = Field(
        4 * 1024 * 1024, ge=0, description="a larger file is changed without a checkpoint"
    )
    replay_sandbox_dir: str = Field(
        "", description="where `--effects sandbox` copies workspaces; '': <tmp>/clawq-replays"
    )
    eval_parallel: int = Field(8, ge=1, description="an eval suite's cases running at once")


class Browser(BaseModel):
    # the browser (group ui): Playwright driving the system's Chromium, a context per session
    browser_executable: str = Field("/usr/bin/chromium", description="no browser is downloaded")
    browser_max_tabs: int = Field(5, ge=1)
    browser_idle_s: float = Field(600.0, gt=0, description="an unused session is closed")
    browser_session_max_s: float = Field(3600.0, gt=0, description="a session's longest life")
    browser_action_timeout_s: float = Field(15.0, gt=0)
    browser_snapshot_max_chars: int = Field(20_000, ge=500)
    browser_evaluate_enabled: bool = Field(False, description="the evaluate action (asks too)")
    browser_download_dir: str = Field("/tmp/clawq-downloads", description="quarantine")
    ui_worker_concurrency: int = Field(8, ge=1, description="threads of a ui worker")
    canvas_max_bytes: int = Field(1024 * 1024, ge=1024, description="one canvas version")
    canvas_keep_versions: int = Field(20, ge=1)
    canvas_link_ttl_s: float = Field(600.0, gt=0, description="a signed canvas link opens")


class Cron(BaseModel):
    # cron (group automation): scheduled agent jobs, ticked by every orchestrator
    cron_tick_s: float = Field(1.0, gt=0)
    cron_max_jobs_per_agent: int = Field(50, ge=1)
    cron_max_payload_bytes: int = Field(4096, ge=64, description="a job's prompt")


class Messaging(BaseModel):
    # messaging (group messaging): channels by name; secrets come from environment variables
    # that a channel names (`token_env`, `secret_env`, `password_env`), never from here
    message_channels: dict[str, MessageChannel] = Field(
        default_factory=dict, description="name → channel (webhook, slack, telegram, email)"
    )
    message_rate_per_minute: int = Field(30, ge=1, description="sends per channel, cluster-wide")
    message_max_chars: int = Field(4000, ge=100, description="one message's text")
    message_max_attachments: int = Field(10, ge=0)
    message_timeout_s: float = Field(20.0, gt=0, description="one provider request")
    # a job's answer written live in the chat it came from (a channel's `live_answers`)
    chat_preview_interval_s: float = Field(
        1.0, ge=0.1, description="between two requests to one chat (Telegram: ~1/s a chat)"
    )
    chat_preview_retry_s: float = Field(
        15.0, gt=0, description="a final answer not yet in the chat is sent again after"
    )
    chat_preview_final_attempts: int = Field(5, ge=1, description="then a final is given up")


class Media(BaseModel):
    # media (group media): tts, image, skill_search
    tts_providers: list[TtsProvider] = Field(
        default_factory=lambda: list[TtsProvider](["espeak"]), description="tried in this order"
    )
    tts_format: Literal["opus", "mp3"] = "opus"
    tts_voice: str = Field("", description="the provider's voice; '': its default")
    tts_max_chars: int = Field(4000, ge=100, description="per provider request")
    tts_max_total_chars: int = Field(20_000, ge=100, description="one call's text")
    tts_timeout_s: float = Field(60.0, gt=0, description="one provider request (or espeak-ng)")
    openai_tts_model: str = "gpt-4o-mini-tts"
    elevenlabs_base_url: str = "https://api.elevenlabs.io"
    elevenlabs_api_key: str = ""
    elevenlabs_voice_id: str = "21m00Tcm4TlvDqDrYTX3"
    elevenlabs_model: str = "eleven_multilingual_v2"
    image_providers: list[str] = Field(
        default_factory=lambda: ["openai"], description="openai, or names of image_endpoints"
    )
    image_model: str = "gpt-image-1"
    image_endpoints: dict[str, ImageEndpoint] = Field(
        default_factory=dict, description="name → another OpenAI-compatible images endpoint"
    )
    image_max_n: int = Field(4, ge=1, le=10)
    image_timeout_s: float = Field(120.0, gt=0)
    media_quota_per_day: dict[str, int] = Field(
        default_factory=dict, description="provider → requests a day, cluster-wide"
    )
    skill_roots: list[str] = Field(
        default_factory=list, description="folders of skills (each a folder with a SKILL.md)"
    )
    skill_search_max_results: int = Field(5, ge=1, le=50)


class Processes(BaseModel):
    # the process tool (background commands of a session)
    process_state_dir: str = "/tmp/clawq-processes"
    process_output_cap_bytes: int = Field(1024 * 1024, ge=1024, description="kept per process")
    process_max_per_session: int = Field(8, ge=1)


class Waiting(BaseModel):
    # calls no worker takes
    call_waiting_after_s: float = Field(5.0, gt=0, description="then tool_call_waiting")
    schedule_to_start_timeout_s: float = Field(
        300.0, gt=0, description="a call no worker started by then is answered with an error"
    )


class Budgets(BaseModel):
    # budgets: per root job, for it and all its subagents (0: no limit)
    budget_turns: int = Field(0, ge=0, description="model turns of a whole tree")
    budget_tokens: int = Field(0, ge=0, description="tokens the providers reported")
    budget_cost_usd: float = Field(0.0, ge=0, description="dollars, by model_prices")
    model_prices: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="model → (input, output) dollars per 1M tokens"
    )


class Operations(BaseModel):
    # operations
    metrics_port: int = Field(0, ge=0, le=65535, description="orchestrator /metrics; 0: off")
    worker_metrics_port: int = Field(0, ge=0, le=65535, description="a host's workers; 0: off")
    metrics_dir: str = Field("/tmp/clawq-metrics", description="worker processes' sample files")
    otlp_endpoint: str = Field("", description="OTLP/HTTP traces URL; '': tracing off")


class Cluster(BaseModel):
    # the cluster
    node_name: str = Field("", description="this host's name in the cluster; '': the hostname")

    def node(self) -> str:
        """The name of this node: its queues (runtime.<node>) and heartbeats carry it."""
        import socket

        return self.node_name or socket.gethostname()


class Workers(BaseModel):
    # workers
    worker_concurrency: int = Field(4, ge=1)
    worker_pool: Literal["direct", "prefork", "threads", "solo"] = Field(
        "direct",
        description="direct: N processes that each take their own calls (no hand-over)",
    )
    read_claim_after_s: float = Field(
        0.2,
        gt=0,
        description="a read runs before its claim; one still running after this is claimed",
    )
    task_events: bool = Field(
        False, description="Celery task events for Flower; measured at ~4 ms a call (make bench)"
    )
