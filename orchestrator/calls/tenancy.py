"""Tenancy: a job acts for one user and never with more than an admin granted that user.

A user's ceiling (live key `user_ceilings`, `*` for users not named) bounds the rules a job
may allow, the permission modes it may use, and where its workspace may lie. It is checked
at the API's edge when a job is submitted, and again as any job starts (a cron run, a
subagent, an announce job pass the orchestrator too), so every way a job is made is bounded
by the same check. A job submitted with an admin's key is not bounded; what only people may
do still needs an admin's approval call by call (the gate).
"""

from __future__ import annotations

import contextlib
import os

from broker.config.policy import Ceiling
from broker.config.settings import Settings
from broker.errors import Forbidden
from broker.protocol import JobSpec
from broker.stores.api_keys import USER_ID
from orchestrator.calls.permissions import NETWORK_RULE
from orchestrator.calls.rules import Rule, RuleError


class TenancyError(Forbidden, ValueError):
    """A job that asks for more than its user may: `rule` names the bound it breaks."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"{message} ({rule})", field=rule)
        self.rule = rule


def valid_user(user: str) -> str:
    """A user id fit to be a directory name and a key's owner."""
    if not USER_ID.match(user):
        raise TenancyError("user", f"'{user}' is not a user id: letters, digits and ._@- only")
    return user


def ceiling_of(settings: Settings, user: str) -> tuple[Ceiling, str]:
    """The user's ceiling and the setting it comes from."""
    if user in settings.user_ceilings:
        return settings.user_ceilings[user], f"user_ceilings.{user}"
    if "*" in settings.user_ceilings:
        return settings.user_ceilings["*"], "user_ceilings.*"
    return Ceiling(), "the default ceiling"


def roots_of(settings: Settings, user: str) -> list[str]:
    """Where the user's workspaces may lie, each resolved (a symlinked root counts as
    where it points)."""
    ceiling, _ = ceiling_of(settings, user)
    roots = [os.path.join(settings.workspace_root, user)]
    roots += [root.replace("{user}", user) for root in ceiling.workspace_roots]
    return [os.path.realpath(root) for root in roots]


def workspace_for(settings: Settings, user: str, requested: str) -> str:
    """The absolute workspace a user's job gets: empty is `<root>/<user>`, a relative path
    lies under it; the resolved path (symlinks followed) must lie under one of the user's
    roots. The user's default root is made if it is missing."""
    valid_user(user)
    home = os.path.join(settings.workspace_root, user)
    path = os.path.join(home, requested) if not os.path.isabs(requested) else requested
    resolved = os.path.realpath(path)
    roots = roots_of(settings, user)
    if not any(resolved == root or resolved.startswith(root + os.sep) for root in roots):
        _, source = ceiling_of(settings, user)
        raise TenancyError(
            f"{source}.workspace_roots",
            f"workspace {requested} is outside user {user}'s roots ({', '.join(roots)})",
        )
    if resolved.startswith(os.path.realpath(home)):
        with contextlib.suppress(OSError):  # another host's path: the workers make it
            os.makedirs(resolved, mode=0o700, exist_ok=True)
    return resolved


def _within(rule: Rule, ceiling: Ceiling) -> bool:
    if rule.tool == NETWORK_RULE and rule.specifier is None:
        return ceiling.network
    for raw in ceiling.allow:
        if raw.strip() == "*":
            return True
        bound = Rule.parse(raw, "allow", "ceiling")
        if bound.tool == rule.tool and bound.specifier in (None, rule.specifier):
            return True
    return False


def check(spec: JobSpec, settings: Settings) -> None:
    """Refuse a job outside its user's ceiling, naming the bound it breaks."""
    if spec.admin:
        return
    user = valid_user(spec.user_id) if spec.user_id else ""
    if not user:
        raise TenancyError("user", "a job submitted without an admin key acts for a user")
    ceiling, source = ceiling_of(settings, user)
    if spec.permission_mode not in ceiling.modes:
        raise TenancyError(
            f"{source}.modes",
            f"permission_mode {spec.permission_mode} is not granted to user {user}",
        )
    for raw in spec.allow:
        try:
            rule = Rule.parse(raw, "allow", "job")
        except RuleError as exc:
            raise TenancyError("allow", str(exc)) from None
        if not _within(rule, ceiling):
            field = f"{source}.network" if rule.tool == NETWORK_RULE else f"{source}.allow"
            raise TenancyError(field, f"the allow rule {raw} is beyond what user {user} may allow")
    workspace_for(settings, user, spec.workspace)
