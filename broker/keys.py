"""Names of every Redis key clawq uses, in one place."""

PREFIX = "clawq"


def call(job_id: str, turn: int, call_id: str) -> str:
    """Hot half of the tool-call ledger: status, owner process, attempts, outcome.

    Keyed by job, turn and the model's call id: ids are unique within a turn by contract,
    while a script (or a careless model) may reuse one in a later turn."""
    return f"{PREFIX}:call:{job_id}:{turn}:{call_id}"


def proc(proc_id: str) -> str:
    """Presence of one live process (worker executor or orchestrator), kept by heartbeats."""
    return f"{PREFIX}:proc:{proc_id}"


PROC_PATTERN = f"{PREFIX}:proc:*"
PROC_PREFIX = f"{PREFIX}:proc:"


def reply(orchestrator_id: str) -> str:
    """List on which workers push outcomes for one orchestrator process."""
    return f"{PREFIX}:reply:{orchestrator_id}"


def events(job_id: str) -> str:
    """Redis stream of a job's typed events (the client's resumable feed)."""
    return f"{PREFIX}:events:{job_id}"


def cancel(job_id: str) -> str:
    return f"{PREFIX}:cancel:{job_id}"


def lease(job_id: str) -> str:
    """Which orchestrator runs a job; expires when that orchestrator stops heartbeating."""
    return f"{PREFIX}:lease:{job_id}"


CONTROL_CHANNEL = f"{PREFIX}:control"


def rate(session_key: str) -> str:
    """Sliding window of a session's tool calls."""
    return f"{PREFIX}:rate:{session_key}"


def approval(request_id: str) -> str:
    """A pending approval request, and (`:answer`) its answer."""
    return f"{PREFIX}:approval:{request_id}"


def sandbox_used(container: str) -> str:
    """Present while a sandbox container has been used within the idle timeout."""
    return f"{PREFIX}:sandbox:{container}"


def session_ended(session_id: str) -> str:
    """Set when a session's job ends: its background processes are then killed."""
    return f"{PREFIX}:ended:{session_id}"


def cancel_call(job_id: str, turn: int, call_id: str) -> str:
    """Set to stop one call (an error cascade, a steer): its worker kills it."""
    return f"{PREFIX}:cancel:{job_id}:{turn}:{call_id}"


def turn_gate(gate: str) -> str:
    """A list that holds "stored" once the turn whose calls carry `gate` is stored: the
    calls sent while it was being stored act only then (CallEnvelope.gate)."""
    return f"{PREFIX}:gate:{gate}"


def steer(job_id: str) -> str:
    """Messages a user sent to redirect a running job, oldest first."""
    return f"{PREFIX}:steer:{job_id}"


SUBAGENTS_RUNNING = f"{PREFIX}:subagents:running"  # child job → lease expiry (ms)


def subagent_children(parent_session: str) -> str:
    """A parent's children, counted until archived."""
    return f"{PREFIX}:subagents:children:{parent_session}"


ANNOUNCE_DUE = f"{PREFIX}:announce-due"  # parent session → when its batch is due


def announce(parent_session: str) -> str:
    """Children's results waiting for their parent, in arrival order."""
    return f"{PREFIX}:announce:{parent_session}"


def announced(child_job: str) -> str:
    """Set once a child's result is queued: a repeated announce step adds nothing."""
    return f"{PREFIX}:announced:{child_job}"


def session_active(session_id: str) -> str:
    """The job now running in a session; absent when none is (a message then starts one)."""
    return f"{PREFIX}:active:{session_id}"


def inbox(job_id: str) -> str:
    """Announcements and messages for a running job, taken as input at its next turn."""
    return f"{PREFIX}:inbox:{job_id}"


def released(job_id: str) -> str:
    """Set when a job has ended and handed its inbox back: nothing may be added to it."""
    return f"{PREFIX}:released:{job_id}"


CHANGES_CHANNEL = f"{PREFIX}:changes"
CONFIG_TOPIC = "config"  # the live configuration's topic (broker/config/live.py)


def version(topic: str) -> str:
    """The version counter of a cached topic (`mcp`, `custom_tools`, `config`, …)."""
    return f"{PREFIX}:version:{topic}"


def routed_files(agent_id: str) -> str:
    """A token that changes with every write of an agent's routed files (context files,
    memory): a worker's cached listing of them is answered only while it holds the token
    it was read under (checked with the call's claim, `Ledger.begin_finish`)."""
    return f"{PREFIX}:routed:{agent_id}"


def consumer(queue: str) -> str:
    """A live process consumes `queue` (`<group>.<node>`), kept by the heartbeats of that
    node's workers of the group: one read says whether a routed call can be answered."""
    return f"{PREFIX}:consumer:{queue}"


def pin(session_id: str, tool: str) -> str:
    """Where a session's stateful tool lives: {"queue", "proc"} (JSON), set by the tool."""
    return f"{PREFIX}:pin:{session_id}:{tool}"


def canvas(session_id: str) -> str:
    """Pub/sub channel: a session's canvas has a new version (its number)."""
    return f"{PREFIX}:canvas:{session_id}"


CANVAS_LINK_KEY = f"{PREFIX}:canvas-link-key"  # the cluster's random key signing canvas links


def budget(root_job: str) -> str:
    """The counters of a root job's tree: turns, tokens, cost (micro-dollars)."""
    return f"{PREFIX}:budget:{root_job}"


def agents_taken(orchestrator_id: str) -> str:
    """Agent runs an orchestrator took off the `agents` queue and has not yet settled."""
    return f"{PREFIX}:agents:taken:{orchestrator_id}"


AGENTS_TAKERS = f"{PREFIX}:agents:takers"  # orchestrators that may hold taken runs


CALLS_WAITING = f"{PREFIX}:calls:waiting"  # job:turn:call → {queue, tool, job, since}


def mcp_oauth(server: str, subject: str = "") -> str:
    """The lock held while one mcp worker refreshes a server's OAuth tokens."""
    return f"{PREFIX}:mcp-oauth:{server}:{subject}"


def cooldown(provider: str, label: str) -> str:
    """A model credential resting after a 429, cluster-wide; expires when it may be used."""
    return f"{PREFIX}:cooldown:{provider}:{label}"


def chat_preview(job_id: str) -> str:
    """A job's answer written live in its chat: what the orchestrator says now (version,
    text, final) and what a messaging worker did with it (version applied, message id,
    a send it began, parts of the final sent)."""
    return f"{PREFIX}:preview:{job_id}"


def chat_preview_lock(job_id: str) -> str:
    """Held by the one messaging worker process that writes a job's preview now."""
    return f"{PREFIX}:preview-lock:{job_id}"


def chat_slot(channel: str, chat: str) -> str:
    """When (Redis time, ms) the next request to one chat may go: its rate limit."""
    return f"{PREFIX}:chat-slot:{channel}:{chat}"


CHAT_FINALS_DUE = f"{PREFIX}:preview-finals"  # job → when its final is looked at again
