"""The deployment recipe in deploy/, checked statically: no Docker engine runs here.

The compose file is read with PyYAML (which resolves the `<<: *clawq` merge keys as
Compose does), worker commands are parsed by the real `clawq` CLI, and the set of worker
services is compared with the tool groups of the registry, so a group that gains tools
without a worker service fails here.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest
import yaml

from broker.config.settings import Settings
from broker.protocol import Group
from orchestrator.cli import main as cli
from workers.registry import default_registry

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "compose.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
WORKSPACES = "/workspaces"
BASE_IMAGE = "python:3.11-slim"

Service = dict[str, Any]


# --- compose helpers -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict), "compose.yaml is not a mapping"
    assert isinstance(data.get("services"), dict) and data["services"], "no services"
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Service]:
    return compose["services"]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def app_services(services: dict[str, Service]) -> dict[str, Service]:
    """The services running clawq: those built from the repository."""
    apps = {name: svc for name, svc in services.items() if "build" in svc}
    assert apps, "no service builds the clawq image"
    return apps


@pytest.fixture(scope="module")
def worker_services(app_services: dict[str, Service]) -> dict[str, Service]:
    return {n: s for n, s in app_services.items() if command_args(s)[:1] == ["worker"]}


def command_args(service: Service) -> list[str]:
    command = service.get("command", [])
    if isinstance(command, str):
        return shlex.split(command)
    assert isinstance(command, list), f"command must be a string or a list: {command!r}"
    return [str(a) for a in command]


def environment(service: Service) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def service_using(services: dict[str, Service], image: str) -> str:
    """The one service running `image` (e.g. `redis`), whatever its name."""
    names = [n for n, s in services.items() if str(s.get("image", "")).split(":")[0] == image]
    assert len(names) == 1, f"expected exactly one {image} service, found {names}"
    return names[0]


def volume_mounts(service: Service) -> list[tuple[str, str]]:
    """(source, target) of each mount, from the short or the long syntax."""
    mounts = []
    for vol in service.get("volumes", []):
        if isinstance(vol, str):
            source, target = vol.split(":")[:2]
        else:
            source, target = vol.get("source", ""), vol["target"]
        mounts.append((source, target))
    return mounts


def worker_group(name: str, service: Service) -> str:
    """The group a worker service serves, as the real CLI parses its command."""
    args = command_args(service)
    ctx = cli.worker.make_context("worker", args[1:])
    group = ctx.params["group"]
    assert isinstance(group, str), f"{name}: no --group"
    return group


# --- compose ------------------------------------------------------------------------------


def test_compose_declares_the_stack(compose: dict[str, Any], services: dict[str, Service]) -> None:
    assert {"redis", "postgres", "orchestrator", "flower"} <= set(services)
    assert "x-clawq" in compose, "the shared settings of clawq services are in x-clawq"
    assert "workspaces" in (compose.get("volumes") or {}), "named volume workspaces undeclared"


def test_every_build_uses_the_deploy_dockerfile(app_services: dict[str, Service]) -> None:
    assert DOCKERFILE.is_file()
    for name, svc in app_services.items():
        build = svc["build"]
        assert isinstance(build, dict), f"{name}: build must name its context and dockerfile"
        context = (COMPOSE_FILE.parent / build["context"]).resolve()
        assert context == ROOT, f"{name}: build context {context} is not the repository root"
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE, name


def test_the_app_services_are_the_clawq_processes(
    app_services: dict[str, Service], worker_services: dict[str, Service]
) -> None:
    assert {"orchestrator", "flower"} <= set(app_services)
    assert command_args(app_services["orchestrator"]) == ["orchestrator"]
    assert command_args(app_services["flower"]) == ["flower", "--address", "0.0.0.0"]
    assert worker_services, "no worker service"


def test_the_api_serves_behind_a_tls_proxy_and_publishes_on_loopback(
    app_services: dict[str, Service],
) -> None:
    from orchestrator.api.serve import check_exposure

    api = app_services["api"]
    args = command_args(api)
    assert args[:2] == ["api", "--host"]
    settings = Settings.model_validate(
        {k.removeprefix("CLAWQ_").lower(): v for k, v in api["environment"].items()}
    )
    check_exposure(settings, args[2])  # it would start: a proxy in front terminates TLS
    assert all(p.startswith("127.0.0.1:") for p in api["ports"])


def test_one_worker_service_per_tool_group(worker_services: dict[str, Service]) -> None:
    # the mcp group is dynamic (tools come from the catalog): it needs its workers too
    expected = [g.value for g in default_registry().groups()] + [Group.mcp.value]
    assert expected, "the registry has no tool groups"
    served = Counter(worker_group(n, s) for n, s in worker_services.items())
    assert sorted(served) == sorted(expected), (
        f"worker services serve {sorted(served)}, the registry's tool groups are {expected}"
    )
    assert all(count == 1 for count in served.values()), f"a group has two services: {served}"
    for name, svc in worker_services.items():
        assert name == f"worker-{worker_group(name, svc)}", f"{name}: name it worker-<group>"


def test_worker_commands_parse_with_the_cli(worker_services: dict[str, Service]) -> None:
    for name, svc in worker_services.items():
        args = command_args(svc)
        assert cli.main.get_command(click.Context(cli.main), args[0]) is cli.worker
        ctx = cli.worker.make_context("worker", args[1:])
        assert ctx.params["group"] in [*default_registry().groups(), Group.mcp], name
        if ctx.params["concurrency"] is not None:
            assert ctx.params["concurrency"] >= 1, name


def test_the_cli_rejects_an_unknown_group() -> None:
    """The check above is real: a group the CLI does not know does not parse."""
    with pytest.raises(click.BadParameter):
        cli.worker.make_context("worker", ["--group", "no-such-group"])
    with pytest.raises(click.MissingParameter):
        cli.worker.make_context("worker", [])


def test_other_app_commands_are_cli_subcommands(app_services: dict[str, Service]) -> None:
    root = click.Context(cli.main)
    for name, svc in app_services.items():
        args = command_args(svc)
        assert args, f"{name}: no command"
        command = cli.main.get_command(root, args[0])
        assert command is not None, f"{name}: `clawq {args[0]}` does not exist"
        command.make_context(args[0], args[1:], parent=root)


def test_app_services_get_the_urls_of_redis_and_postgres(
    services: dict[str, Service],
    app_services: dict[str, Service],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    redis_host = service_using(services, "redis")
    postgres_host = service_using(services, "postgres")
    for name, svc in app_services.items():
        env = environment(svc)
        redis_url = urlsplit(env.get("CLAWQ_REDIS_URL", ""))
        assert (redis_url.scheme, redis_url.hostname) == ("redis", redis_host), name
        assert redis_url.port in (None, 6379), name
        db_url = urlsplit(env.get("CLAWQ_DATABASE_URL", ""))
        assert db_url.scheme in ("postgresql", "postgres"), name
        assert db_url.hostname == postgres_host and db_url.port in (None, 5432), name
        # the variable names are the ones the settings read
        for var in ("CLAWQ_REDIS_URL", "CLAWQ_DATABASE_URL"):
            monkeypatch.setenv(var, env[var])
        settings = Settings()
        assert settings.redis_url == env["CLAWQ_REDIS_URL"], name
        assert settings.database_url == env["CLAWQ_DATABASE_URL"], name


def test_app_services_start_after_healthy_postgres(
    services: dict[str, Service], app_services: dict[str, Service]
) -> None:
    redis_name = service_using(services, "redis")
    postgres_name = service_using(services, "postgres")
    for name, svc in app_services.items():
        depends = svc.get("depends_on", {})
        if isinstance(depends, list):
            depends = {d: {"condition": "service_started"} for d in depends}
        assert {redis_name, postgres_name} <= set(depends), f"{name}: depends_on {depends}"
        assert depends[postgres_name].get("condition") == "service_healthy", name
        for dep, spec in depends.items():
            if spec.get("condition") == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits on {dep}: no healthcheck"
    assert "pg_isready" in json.dumps(services[postgres_name]["healthcheck"]["test"])


def test_redis_keeps_the_queues_across_restarts(services: dict[str, Service]) -> None:
    redis = services[service_using(services, "redis")]
    args = command_args(redis)
    assert "--appendonly" in args and args[args.index("--appendonly") + 1] == "yes", args
    assert any(target == "/data" for _, target in volume_mounts(redis)), "AOF not on a volume"
    # fsynced before each reply (a machine's crash loses no acknowledged outcome), and
    # nothing evicted (an evicted ledger entry or queued call would be lost)
    assert args[args.index("--appendfsync") + 1] == "always", args
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction", args


def test_workers_are_scalable(worker_services: dict[str, Service]) -> None:
    for name, svc in worker_services.items():
        # a fixed name or host port makes a second replica fail; a fixed hostname gives
        # every replica the same Celery node name
        for key in ("container_name", "ports", "hostname"):
            assert key not in svc, f"{name}: {key} prevents --scale"


def test_workers_share_the_workspaces_volume(
    compose: dict[str, Any], worker_services: dict[str, Service]
) -> None:
    assert "workspaces" in (compose.get("volumes") or {})
    for name, svc in worker_services.items():
        assert ("workspaces", WORKSPACES) in volume_mounts(svc), f"{name}: {svc.get('volumes')}"


def test_flower_publishes_its_dashboard(services: dict[str, Service]) -> None:
    ports = [str(p) for p in services["flower"].get("ports", [])]
    assert any(p.split(":")[-1] == "5555" for p in ports), ports


# --- Dockerfile ---------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends in a continuation"
    return instructions


def stage(name: str) -> list[tuple[str, str]]:
    """The instructions of the stage `FROM … AS name`, up to the next FROM."""
    instructions = dockerfile_instructions()
    starts = [i for i, (kw, _) in enumerate(instructions) if kw == "FROM"]
    for n, start in enumerate(starts):
        if instructions[start][1].lower().endswith(f" as {name}"):
            end = starts[n + 1] if n + 1 < len(starts) else len(instructions)
            return instructions[start:end]
    raise AssertionError(f"no stage {name} in the Dockerfile")


def final_stage() -> list[tuple[str, str]]:
    """What every service but worker-ui runs: the `runtime` stage."""
    return stage("runtime")


def test_the_ui_stage_adds_chromium_to_the_runtime_and_worker_ui_uses_it() -> None:
    ui = stage("ui")
    assert ui[0][1].split()[0] == "runtime"
    assert any(kw == "RUN" and "chromium" in args for kw, args in ui)
    assert [args for kw, args in ui if kw == "USER"][-1] not in ("root", "0")
    services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    assert services["worker-ui"]["build"]["target"] == "ui"
    assert services["worker-fs"]["build"]["target"] == "runtime"


def test_the_media_stage_adds_espeak_and_ffmpeg_and_worker_media_uses_it() -> None:
    media = stage("media")
    assert media[0][1].split()[0] == "runtime"
    assert any(kw == "RUN" and "espeak-ng" in args and "ffmpeg" in args for kw, args in media)
    assert [args for kw, args in media if kw == "USER"][-1] not in ("root", "0")
    services = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    assert services["worker-media"]["build"]["target"] == "media"


def test_dockerfile_is_based_on_python_slim() -> None:
    froms = [args.split() for kw, args in dockerfile_instructions() if kw == "FROM"]
    stages = {f[-1] for f in froms if len(f) == 3 and f[1].lower() == "as"}
    bases = [f[0] for f in froms]
    assert bases and all(b == BASE_IMAGE or b in stages for b in bases), bases


def test_dockerfile_entrypoint_is_the_clawq_script() -> None:
    entrypoints = [args for kw, args in final_stage() if kw == "ENTRYPOINT"]
    assert entrypoints, "no ENTRYPOINT in the final stage"
    assert json.loads(entrypoints[-1]) == ["clawq"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "clawq" in scripts, "the image's entrypoint is not a console script of the package"


def test_dockerfile_installs_the_project() -> None:
    instructions = dockerfile_instructions()
    runs = [shlex.split(args) for kw, args in instructions if kw == "RUN"]
    installs_project = any(
        "pip" in words and "install" in words and any(w == "." or w.startswith(".[") for w in words)
        for words in runs
    )
    assert installs_project, "no `pip install .`"
    copied = {
        Path(src).name
        for kw, args in instructions
        if kw == "COPY" and not args.startswith("--from")
        for src in shlex.split(args)[:-1]
    }
    if "." not in copied:
        pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
        packages = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
        needed = {"pyproject.toml"} | {p.rstrip("*") for p in packages}
        assert needed <= copied, f"the build does not copy {sorted(needed - copied)}"


def test_dockerfile_runs_as_a_non_root_user_with_a_workspaces_dir() -> None:
    stage = final_stage()
    users = [args.split(":")[0] for kw, args in stage if kw == "USER"]
    assert users and users[-1] not in ("root", "0"), f"final USER: {users}"
    runs = " ".join(args for kw, args in stage if kw == "RUN")
    assert WORKSPACES in runs and "chown" in runs, (
        "the image must create /workspaces owned by its user, so a fresh named volume is "
        "writable by the workers"
    )
