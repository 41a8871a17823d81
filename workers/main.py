"""Starting a worker process: a Celery worker on one group's queue."""

from __future__ import annotations

import logging
import os
import warnings

from broker.celery.app import UNLEDGERED_QUEUES, create_app
from broker.config.settings import Settings
from broker.errors import ConfigurationError
from broker.protocol import Group
from workers.confine import host as confine
from workers.consumer import CONSUMER
from workers.pool import SINGLE_CALL_POOL
from workers.processes import Processes
from workers.registry import Registry
from workers.tasks import register_tool_tasks
from workers.tools.runtime.process import host_queue

ALONE = (Group.runtime.value, Group.web.value, Group.ui.value)  # a worker of their own


class WorkerGroupsError(ConfigurationError):
    """Groups that cannot share one worker."""


def superuser_explained() -> None:
    """As root, say once why Celery's superuser warning is not printed by every process:
    it is about pickle, which clawq never accepts (JSON only). Running as another user still
    gives a tool less to reach."""
    if os.geteuid() != 0:
        return
    from celery.exceptions import SecurityWarning

    warnings.filterwarnings("ignore", category=SecurityWarning)
    logging.getLogger("clawq.worker").warning(
        "running as root: Celery's superuser warning is silenced (this worker accepts JSON"
        " only, never pickle); a user of its own gives the tools less to reach"
    )


def run_worker(
    settings: Settings,
    registry: Registry,
    group: str,
    concurrency: int | None = None,
    pool: str | None = None,
    log_level: str = "info",
) -> None:
    """Consume `group`'s queue until stopped; `group` may name several light groups
    (`fs,sessions,memory`), whose queues one worker then consumes. No gossip or mingle:
    workers need not know each other, and both cost start-up time and broker traffic on
    every node."""
    from broker.obs import metrics

    groups = group.split(",")
    if len(groups) > 1 and (alone := [g for g in groups if g in ALONE]):
        raise WorkerGroupsError(
            f"{', '.join(alone)} need a worker of their own (their pools and host queues);"
            " only the other groups share one"
        )
    superuser_explained()
    metrics.prepare_worker(settings.metrics_dir)  # before prometheus_client is imported
    # kombu's ack emulation is the transport's: on if any of the groups needs it
    app = create_app(settings, ack_emulation=any(g in UNLEDGERED_QUEUES for g in groups))
    app.conf.worker_consumer = CONSUMER  # back on the broker within a second of its return
    app.conf.broker_connection_max_retries = None
    if Group.mcp.value in groups:  # MCP tools come from the catalog, by exposed name
        from workers.tools.mcp.tool import McpRegistry

        registry = McpRegistry(registry, settings)
    if group == Group.runtime.value:  # custom tools come from PostgreSQL, by agent and name
        from workers.tools.custom_tools.tool import CustomRegistry

        registry = CustomRegistry(registry, settings)
    register_tool_tasks(app, registry, settings, groups)
    if group == Group.web.value:  # calls wait on the network: many threads in one process
        from workers.tools.web.providers import configured

        configured(settings)  # a provider listed without its key stops the worker here
        pool = pool or "threads"
        concurrency = concurrency or settings.web_worker_concurrency
    if group == Group.ui.value:  # one browser per process, its calls on a thread pool
        pool = pool or "threads"
        concurrency = concurrency or settings.ui_worker_concurrency
    pool = pool or settings.worker_pool
    concurrency = concurrency or settings.worker_concurrency
    # the calls one process runs at once: its connection pools are sized for them
    app.conf.worker_concurrency = 1 if pool == "direct" else concurrency
    # `direct`: N processes, each a Celery worker taking its own calls (workers/processes.py)
    app.conf.worker_pool = "solo" if pool == "direct" else pool  # what the signals see
    queues = list(groups)
    if group == Group.runtime.value:  # calls about a host's background processes
        queues.append(host_queue(settings.node()))
        confine.for_settings(settings)  # probed (and warned about) once, before the fork
    if group == Group.ui.value:  # calls of a session pinned to this process's browser
        from workers.tools.ui.browser import process_queue

        queues.append(process_queue())
    name = group.replace(",", "+")  # the node name: fs+sessions.PID@host
    metrics.serve(settings.worker_metrics_port)  # this host's worker processes, summed
    args = ["worker", "-Q", ",".join(queues), "--without-gossip", "--without-mingle"]
    args += ["-l", log_level.upper()]
    if pool != "direct":
        app.worker_main(
            [*args, "-n", f"{name}.{os.getpid()}@%h", "-P", pool, "-c", str(concurrency)]
        )
        return

    def one_process() -> None:
        app.conf.worker_pool = SINGLE_CALL_POOL  # not a name Celery's CLI knows: by setting
        app.worker_main([*args, "-n", f"{name}.{os.getpid()}@%h", "-c", "1"])

    Processes(concurrency, one_process).run()
