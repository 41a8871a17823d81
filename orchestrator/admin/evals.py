"""Evals: a suite of cases run as ordinary jobs, each judged by its assertions; written
once for the CLI and any client (direct or remote).

A case is a prompt (with a scripted model's script, or any model), or a recorded job to
replay (its calls answered from its ledger). Its assertions cover the status, the final
text (contains, regex, a JSON schema), the calls made and not made, their decisions, and
limits on turns, tokens and cost. A run of the suite is a `SuiteRun`: JSON to keep, JUnit
XML for CI, and `compare` tells two runs apart."""

from __future__ import annotations

import json
import re
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from broker.errors import Invalid, RequestError, RunError
from broker.protocol import FINAL_STATUSES, JobResult, ToolCallRecord


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a typo'd assertion would assert nothing


class TextExpect(Strict):
    contains: list[str] | str = Field(default_factory=list)
    regex: str = ""
    schema_: dict[str, Any] | None = Field(None, alias="schema")


class CallExpect(Strict):
    """A call by its tool, and (optionally) what its input holds."""

    name: str
    input: dict[str, Any] = Field(default_factory=dict)

    def matches(self, call: ToolCallRecord) -> bool:
        return call.name == self.name and all(call.input.get(k) == v for k, v in self.input.items())

    def __str__(self) -> str:
        return self.name + (json.dumps(self.input) if self.input else "")


def _calls(value: Any) -> Any:
    return [{"name": v} if isinstance(v, str) else v for v in value or []]


class CallsExpect(Strict):
    made: list[CallExpect] = Field(default_factory=list)
    not_made: list[CallExpect] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _names(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: _calls(v) for k, v in data.items()}
        return data


class Expect(Strict):
    status: str | None = "completed"
    final_text: TextExpect | None = None
    calls: CallsExpect | None = None
    decisions: dict[str, str] = Field(
        default_factory=dict, description="tool → allow | deny: every call of it was"
    )
    max_turns: int | None = None
    max_tokens: int | None = None
    max_cost_usd: float | None = None
    identical: bool | None = Field(None, description="a replay: the same as its original")


class Case(Strict):
    name: str
    prompt: str = ""
    script: dict[str, Any] | None = None
    job: str = Field("", description="a recorded job: the case replays it")
    model: str | None = None
    workspace: str = ""
    expect: Expect = Field(default_factory=Expect)

    @model_validator(mode="after")
    def _what(self) -> Case:
        if bool(self.prompt) == bool(self.job):
            raise ValueError("a case has a prompt or a job (to replay), one of them")
        return self


class Suite(Strict):
    name: str = "suite"
    model: str = "scripted"
    allow: list[str] = Field(default_factory=list)
    ask: list[str] = Field(default_factory=list)
    deny: list[str] = Field(default_factory=list)
    agent: str = "main"
    workspace: str = Field("", description="every case's; '': a new folder per case")
    timeout_s: float = 300.0
    cases: list[Case] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Suite:
        names = [c.name for c in self.cases]
        if len(set(names)) != len(names):
            raise ValueError("two cases have one name")
        return self


def load_suite(path: str | Path) -> Suite:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise Invalid(f"cannot read the suite {path}: {exc}") from None
    try:
        return Suite.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise Invalid(f"{path}: {first['msg']} at {where}") from None


class CaseResult(BaseModel):
    name: str
    job_id: str = ""
    status: str = ""
    passed: bool = False
    failures: list[str] = Field(default_factory=list)
    turns: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    calls: list[str] = Field(default_factory=list)
    final_text: str = ""


class SuiteRun(BaseModel):
    suite: str
    model: str
    started_at: float
    seconds: float
    cases: list[CaseResult]

    @property
    def failed(self) -> int:
        return sum(1 for c in self.cases if not c.passed)


def judge(expect: Expect, result: JobResult, identical: bool | None = None) -> list[str]:
    """What in the result breaks the case's assertions (empty: it passed)."""
    failures: list[str] = []
    if expect.status and result.status != expect.status:
        failures.append(f"status {result.status}, expected {expect.status} {result.error}".strip())
    text = result.final_text
    if (t := expect.final_text) is not None:
        for part in [t.contains] if isinstance(t.contains, str) else t.contains:
            if part not in text:
                failures.append(f"final text lacks {part!r}")
        if t.regex and not re.search(t.regex, text):
            failures.append(f"final text does not match /{t.regex}/")
        if t.schema_ is not None:
            try:
                jsonschema.validate(json.loads(text), t.schema_)
            except json.JSONDecodeError:
                failures.append("final text is not JSON")
            except jsonschema.ValidationError as exc:
                failures.append(f"final text breaks the schema: {exc.message}")
    if (c := expect.calls) is not None:
        for want in c.made:
            if not any(want.matches(call) for call in result.tool_calls):
                failures.append(f"no call {want}")
        for unwanted in c.not_made:
            if any(unwanted.matches(call) for call in result.tool_calls):
                failures.append(f"a call {unwanted} was made")
    for tool, decision in expect.decisions.items():
        found = [call.decision for call in result.tool_calls if call.name == tool]
        if not found:
            failures.append(f"no call of {tool} to judge its decision")
        elif wrong := [d for d in found if not d.startswith(decision)]:
            failures.append(f"{tool} decided {wrong[0] or 'nothing'}, expected {decision}")
    usage = result.usage
    tokens, cost = (usage.tokens, usage.cost_usd) if usage else (0, 0.0)
    if expect.max_turns is not None and result.iterations > expect.max_turns:
        failures.append(f"{result.iterations} turns, over {expect.max_turns}")
    if expect.max_tokens is not None and tokens > expect.max_tokens:
        failures.append(f"{tokens} tokens, over {expect.max_tokens}")
    if expect.max_cost_usd is not None and cost > expect.max_cost_usd:
        failures.append(f"${cost:.4f}, over ${expect.max_cost_usd:.4f}")
    if expect.identical is not None and identical is not None and identical != expect.identical:
        failures.append("the replay differs from its original" if expect.identical else "identical")
    return failures


def case_result(
    case: Case, job_id: str, result: JobResult, seconds: float, identical: bool | None = None
) -> CaseResult:
    failures = judge(case.expect, result, identical)
    usage = result.usage
    return CaseResult(
        name=case.name,
        job_id=job_id,
        status=result.status,
        passed=not failures,
        failures=failures,
        turns=result.iterations,
        tokens=usage.tokens if usage else 0,
        cost_usd=usage.cost_usd if usage else 0.0,
        seconds=round(seconds, 3),
        calls=[c.name for c in result.tool_calls],
        final_text=result.final_text[:500],
    )


def finished(job: Any) -> JobResult | None:
    result: JobResult = job.result()
    return result if result.status in FINAL_STATUSES else None


def junit(run: SuiteRun) -> str:
    """The run as JUnit XML: a testsuite whose testcases fail with the broken assertions."""
    suites = ET.Element("testsuites")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=run.suite,
        tests=str(len(run.cases)),
        failures=str(run.failed),
        errors="0",
        time=f"{run.seconds:.3f}",
    )
    for c in run.cases:
        case = ET.SubElement(
            suite, "testcase", classname=run.suite, name=c.name, time=f"{c.seconds:.3f}"
        )
        if not c.passed:
            failure = ET.SubElement(case, "failure", message="; ".join(c.failures)[:1000])
            failure.text = "\n".join(c.failures)
        out = ET.SubElement(case, "system-out")
        out.text = f"job {c.job_id}: {c.status}, {c.turns} turns, {c.tokens} tokens"
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)


class CaseChange(BaseModel):
    name: str
    before: str  # passed | failed | absent
    after: str
    turns: tuple[int, int] = (0, 0)
    tokens: tuple[int, int] = (0, 0)
    cost_usd: tuple[float, float] = (0.0, 0.0)


def compare(before: SuiteRun, after: SuiteRun) -> list[CaseChange]:
    """Each case of either run: how it fared in each, and its turns, tokens and cost."""
    old = {c.name: c for c in before.cases}
    new = {c.name: c for c in after.cases}
    changes = []
    for name in [*old, *(n for n in new if n not in old)]:
        o, n = old.get(name), new.get(name)
        changes.append(
            CaseChange(
                name=name,
                before=("passed" if o.passed else "failed") if o else "absent",
                after=("passed" if n.passed else "failed") if n else "absent",
                turns=(o.turns if o else 0, n.turns if n else 0),
                tokens=(o.tokens if o else 0, n.tokens if n else 0),
                cost_usd=(o.cost_usd if o else 0.0, n.cost_usd if n else 0.0),
            )
        )
    return changes


class Overrides(BaseModel):
    """What the command line sets for every case: a model, a policy."""

    model: str | None = None
    allow: list[str] | None = None
    ask: list[str] | None = None
    deny: list[str] | None = None

    def rules(self, suite: Suite) -> dict[str, list[str]] | None:
        """The policy of the run: the command line's, else the suite's if it names one."""
        if any(r is not None for r in (self.allow, self.ask, self.deny)):
            return {"allow": self.allow or [], "ask": self.ask or [], "deny": self.deny or []}
        if suite.allow or suite.ask or suite.deny:
            return {"allow": suite.allow, "ask": suite.ask, "deny": suite.deny}
        return None


def start(client: Any, suite: Suite, case: Case, over: Overrides) -> Any:
    """The case's job, submitted: a replay of its recorded job, or its prompt."""
    rules = over.rules(suite)
    if case.job:
        changes: dict[str, Any] = dict(rules or {})
        if model := over.model or case.model:
            changes["model"] = model
        return client.replay(case.job, **changes)
    model = over.model or case.model or suite.model
    workspace = case.workspace or suite.workspace
    if not workspace and getattr(client, "api_url", None) is None:  # direct: a folder here
        safe = re.sub(r"[^\w.-]", "_", case.name)
        workspace = tempfile.mkdtemp(prefix=f"clawq-eval-{safe}-")
    return client.submit(
        case.prompt,
        workspace=workspace,
        model=model,
        script=case.script if model.partition(":")[0] == "scripted" else None,
        agent=suite.agent,
        **(rules or {}),
    )


def run_suite(
    client: Any,
    suite: Suite,
    over: Overrides,
    parallel: int,
    on_done: Callable[[CaseResult], None] = lambda _: None,
) -> SuiteRun:
    """Every case as an ordinary job, at most `parallel` at once; each judged as it ends."""
    started, t0 = time.time(), time.monotonic()
    waiting = list(suite.cases)
    running: dict[str, tuple[Case, Any, float]] = {}
    done: dict[str, CaseResult] = {}

    def record(result: CaseResult) -> None:
        done[result.name] = result
        on_done(result)

    while waiting or running:
        while waiting and len(running) < parallel:
            case = waiting.pop(0)
            try:
                running[case.name] = (case, start(client, suite, case, over), time.monotonic())
            except (RequestError, RunError) as exc:
                record(CaseResult(name=case.name, failures=[f"not started: {exc}"]))
        for name, (case, job, began) in list(running.items()):
            result = finished(job)
            took = time.monotonic() - began
            if result is None and took > suite.timeout_s:
                job.cancel()
                record(CaseResult(name=name, job_id=job.id, failures=["timed out"], seconds=took))
            elif result is not None:
                identical = client.replay_diff(job.id).identical if case.job else None
                record(case_result(case, job.id, result, took, identical))
            else:
                continue
            del running[name]
        if running:
            time.sleep(0.1)
    return SuiteRun(
        suite=suite.name,
        model=over.model or suite.model,
        started_at=started,
        seconds=round(time.monotonic() - t0, 3),
        cases=[done[c.name] for c in suite.cases],
    )
