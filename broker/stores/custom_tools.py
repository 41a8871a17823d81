"""Custom tools (goclaw §8): shell templates defined at run time, stored in PostgreSQL.

A definition is checked when it is made, not when it first runs: its parameters must be a
JSON Schema (checked against the metaschema by `jsonschema`) of an object, and its command
may only name declared parameters (`{{.key}}`). Where a placeholder may stand, and how a
call's values reach the command (in the environment, never spliced into the line), is
`workers.tools.custom_tools.template`'s, checked by the administration before anything is
stored. Env secrets are sealed (`broker.config.secretbox`) with the tool's id as associated
data; what is stored and shown is only their names. A change bumps the `custom_tools`
version (`broker.redis.changes`), which every orchestrator and worker compares before using
what it cached."""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from broker.config.secretbox import SecretBox
from broker.errors import Invalid
from broker.pg.store import Store

TOPIC = "custom_tools"
PLACEHOLDER = re.compile(r"\{\{\s*\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ARG_PREFIX = "CLAWQ_ARG_"  # a call's values: workers.tools.custom_tools.template
COLUMNS = (
    "id, name, agent_id, description, parameters, command, timeout_seconds, working_dir,"
    " env_names, env_sealed, enabled, version, updated_at"
)


class CustomToolError(Invalid, ValueError):
    """A definition that cannot be stored, or a call that cannot be rendered."""


def placeholders(command: str) -> list[str]:
    return PLACEHOLDER.findall(command)


def check_schema(schema: dict[str, Any]) -> None:
    """The parameters must be a JSON Schema of an object (the metaschema decides)."""
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(top)"
        raise CustomToolError(
            f"parameters is not a valid JSON Schema at {where}: {exc.message}"
        ) from None
    if schema.get("type") != "object":
        raise CustomToolError('parameters must be a schema of "type": "object"')


class CustomToolSpec(BaseModel):
    """What is defined (the only place env secrets are plaintext: on the way in)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str = Field(min_length=1, max_length=2000)
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    command: str = Field(min_length=1, max_length=10_000)
    timeout_seconds: int = Field(60, ge=1)
    working_dir: str = "."
    env: dict[str, str] = Field(default_factory=dict)
    enabled: bool = True
    agent_id: str = ""

    @field_validator("parameters")
    @classmethod
    def _schema(cls, value: dict[str, Any]) -> dict[str, Any]:
        check_schema(value)
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not ENV_NAME.match(k)]
        if bad:
            raise ValueError(f"env names must be identifiers: {', '.join(bad)}")
        taken = [k for k in value if k.startswith(ARG_PREFIX)]
        if taken:
            raise ValueError(f"env names starting {ARG_PREFIX} carry arguments: {', '.join(taken)}")
        return value

    @model_validator(mode="after")
    def _template(self) -> CustomToolSpec:
        declared = set((self.parameters.get("properties") or {}).keys())
        unknown = sorted(set(placeholders(self.command)) - declared)
        if unknown:
            raise ValueError(
                "command names undeclared parameters: "
                + ", ".join(f"{{{{.{k}}}}}" for k in unknown)
                + f" (declared: {', '.join(sorted(declared)) or 'none'})"
            )
        return self


class CustomTool(BaseModel):
    """A stored definition as every process sees it: no secret, only their names."""

    id: str
    name: str
    agent_id: str = ""
    description: str
    parameters: dict[str, Any]
    command: str
    timeout_seconds: int = 60
    working_dir: str = "."
    env_names: list[str] = Field(default_factory=list)
    env_sealed: str = Field("", exclude=True)  # never in an API answer
    enabled: bool = True
    version: int = 1
    updated_at: datetime | None = None
    # why a stored tool cannot run: its template breaks the rule of
    # `workers.tools.custom_tools.template` (it was stored before templates were checked);
    # filled in where it is read
    problem: str = ""

    def validate_arguments(self, arguments: dict[str, Any]) -> None:
        """Raise `CustomToolError` naming the first argument the schema refuses."""
        import jsonschema

        validator = jsonschema.validators.validator_for(self.parameters)(self.parameters)
        error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
        if error is not None:
            where = ".".join(str(p) for p in error.absolute_path) or "input"
            raise CustomToolError(f"{where}: {error.message}")

    def secrets(self, box: SecretBox) -> dict[str, str]:
        """The env secrets, opened (on a worker, for one call)."""
        if not self.env_sealed:
            return {}
        values = json.loads(box.open(self.env_sealed, self.id.encode()))
        return {str(k): str(v) for k, v in values.items()}


def _row(row: dict[str, Any]) -> CustomTool:
    return CustomTool.model_validate(row)


class CustomToolStore:
    """Definitions in PostgreSQL (synchronous: the CLI, the API, workers)."""

    def __init__(self, store: Store) -> None:
        self.conn = store.conn

    def put(self, spec: CustomToolSpec, box: SecretBox) -> CustomTool:
        """Create or replace the tool (name, agent); its id stays across replacements."""
        existing = self.get(spec.name, spec.agent_id)
        tool_id = existing.id if existing else uuid.uuid4().hex
        sealed = box.seal(json.dumps(spec.env).encode(), tool_id.encode()) if spec.env else ""
        row = self.conn.execute(
            f"INSERT INTO custom_tools (id, name, agent_id, description, parameters, command,"
            f" timeout_seconds, working_dir, env_names, env_sealed, enabled)"
            f" VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            f" ON CONFLICT (name, agent_id) DO UPDATE SET description = EXCLUDED.description,"
            f" parameters = EXCLUDED.parameters, command = EXCLUDED.command,"
            f" timeout_seconds = EXCLUDED.timeout_seconds, working_dir = EXCLUDED.working_dir,"
            f" env_names = EXCLUDED.env_names, env_sealed = EXCLUDED.env_sealed,"
            f" enabled = EXCLUDED.enabled, version = custom_tools.version + 1,"
            f" updated_at = now() RETURNING {COLUMNS}",
            (
                tool_id,
                spec.name,
                spec.agent_id,
                spec.description,
                Jsonb(spec.parameters),
                spec.command,
                spec.timeout_seconds,
                spec.working_dir,
                Jsonb(sorted(spec.env)),
                sealed,
                spec.enabled,
            ),
        ).fetchone()
        assert row is not None
        return _row(row)

    def get(self, name: str, agent_id: str = "") -> CustomTool | None:
        row = self.conn.execute(
            f"SELECT {COLUMNS} FROM custom_tools WHERE name = %s AND agent_id = %s",
            (name, agent_id),
        ).fetchone()
        return _row(row) if row else None

    def all(self) -> list[CustomTool]:
        rows = self.conn.execute(
            f"SELECT {COLUMNS} FROM custom_tools ORDER BY name, agent_id"
        ).fetchall()
        return [_row(r) for r in rows]

    def set_enabled(self, name: str, agent_id: str, enabled: bool) -> bool:
        done = self.conn.execute(
            "UPDATE custom_tools SET enabled = %s, version = version + 1, updated_at = now()"
            " WHERE name = %s AND agent_id = %s",
            (enabled, name, agent_id),
        )
        return done.rowcount > 0

    def remove(self, name: str, agent_id: str) -> bool:
        done = self.conn.execute(
            "DELETE FROM custom_tools WHERE name = %s AND agent_id = %s", (name, agent_id)
        )
        return done.rowcount > 0

    def for_agent(self, agent_id: str) -> list[CustomTool]:
        return shadowed(
            [
                _row(r)
                for r in self.conn.execute(
                    f"SELECT {COLUMNS} FROM custom_tools WHERE enabled AND agent_id IN ('', %s)",
                    (agent_id,),
                ).fetchall()
            ]
        )


def shadowed(tools: list[CustomTool]) -> list[CustomTool]:
    """An agent's own tool replaces a global one of the same name."""
    chosen: dict[str, CustomTool] = {}
    for tool in sorted(tools, key=lambda t: t.agent_id != ""):
        chosen[tool.name] = tool
    return sorted(chosen.values(), key=lambda t: t.name)


async def tools_for_agent(pool: AsyncConnectionPool, agent_id: str) -> list[CustomTool]:
    """The orchestrator's read: enabled tools of this agent, agent ones shadowing globals."""
    from psycopg.rows import dict_row

    async with pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            f"SELECT {COLUMNS} FROM custom_tools WHERE enabled AND agent_id IN ('', %s)",
            (agent_id,),
        )
        return shadowed([_row(r) for r in await cur.fetchall()])
