"""Live configuration on real PostgreSQL: validation names the field, keys that are not
live are refused, apply / history / rollback keep every version."""

from __future__ import annotations

import pytest

from broker.live_config import ConfigError, LiveConfigStore, diff, effective, validate
from broker.settings import Settings
from broker.store import Store
from tests.conftest import Isolated


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"approval_timeout_s": 0}, "approval_timeout_s"),
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
            {
                "message_channels": {
                    "x": {"kind": "telegram", "token_env": "CLAWQ_OPENAI_API_KEY"}
                }
            },
        )
    assert refused.value.field.startswith("message_channels")
