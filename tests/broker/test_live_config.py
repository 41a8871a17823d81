"""Live configuration on real PostgreSQL: validation names the field, keys that are not
live are refused, apply / history / rollback keep every version."""

from __future__ import annotations

import pytest

from broker.config.live import ConfigError, LiveConfigStore, diff, effective, validate
from broker.config.settings import Settings
from broker.pg.store import Store
from tests.conftest import Isolated


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"approval_timeout_s": -1}, "approval_timeout_s"),
        ({"tool_policy": {"deny": "exec"}}, "tool_policy.deny"),
        ({"permissions": {"deny": []}}, "permissions"),  # the managed rules: never live
        ({"secret_key": "x"}, "secret_key"),
    ],
)
def test_a_bad_configuration_is_refused_naming_the_field(
    config: dict[str, object], field: str
) -> None:
    with pytest.raises(ConfigError) as err:
        validate(Settings(), config)
    assert err.value.field == field


def test_effective_settings_layer_live_keys_over_the_environment() -> None:
    base = Settings(rate_limit_per_hour=7, exec_timeout_s=9)
    made = effective(base, {"tool_policy": {"deny": ["exec"]}, "rate_limit_per_hour": 3})
    assert made.tool_policy.deny == ["exec"] and made.rate_limit_per_hour == 3
    assert made.exec_timeout_s == 9  # the rest is the environment's
    assert diff({"a": 1}, {"a": 2, "b": 3}) == ["a: 1 → 2", "b: null → 3"]


def test_apply_history_and_rollback(isolated: Isolated) -> None:
    store = Store(isolated.database_url)
    try:
        live = LiveConfigStore(store.conn)
        first = live.apply(Settings(), {"rate_limit_per_hour": 10}, "ann")
        second = live.apply(Settings(), {"rate_limit_per_hour": 20}, "ann")
        assert live.current() is not None and live.current().config == {"rate_limit_per_hour": 20}  # type: ignore[union-attr]
        back = live.rollback("bob")
        assert back > second and live.current().config == {"rate_limit_per_hour": 10}  # type: ignore[union-attr]
        assert [v.status for v in live.history()] == ["applied", "rolled_back", "applied"]
        live.rollback("bob", to=second)
        assert live.current().config == {"rate_limit_per_hour": 20}  # type: ignore[union-attr]
        with pytest.raises(ConfigError):
            live.rollback("bob", to=first + 999)
    finally:
        store.close()


def test_a_channel_may_not_name_one_of_clawqs_own_settings_as_its_secret() -> None:
    with pytest.raises(ConfigError) as refused:
        validate(
            Settings(),
            {"message_channels": {"x": {"kind": "telegram", "token_env": "CLAWQ_OPENAI_API_KEY"}}},
        )
    assert refused.value.field.startswith("message_channels")


def test_the_environments_hooks_survive_a_live_layer() -> None:
    hooks = {"PreToolUse": [{"matcher": "exec", "hooks": [{"command": "/bin/true"}]}]}
    base = Settings.model_validate({"hooks": hooks})
    assert effective(base, {}).hooks == base.hooks
    assert effective(base, {"rate_limit_per_hour": 5}).hooks == base.hooks


def test_a_rejection_is_told_once_and_never_for_the_environment(isolated: Isolated) -> None:
    import redis

    from broker import keys
    from broker.config.live import TOPIC, reject

    store = Store(isolated.database_url)
    try:
        live = LiveConfigStore(store.conn)
        version = live.apply(Settings(), {"rate_limit_per_hour": 10}, "ann")
        with redis.Redis.from_url(isolated.redis_url) as client:
            before = int(client.get(keys.version(TOPIC)) or 0)
            reject(isolated.settings, 0, "the environment")  # nothing to roll back
            for _ in range(3):  # three processes find the same version bad
                reject(isolated.settings, version, "hook program missing")
            assert int(client.get(keys.version(TOPIC)) or 0) == before + 1
        assert [v.status for v in live.history()] == ["bad"]
    finally:
        store.close()
