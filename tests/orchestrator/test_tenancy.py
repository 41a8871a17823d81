"""A user's ceiling: the rules, modes and workspaces a job of theirs may ask for (pure logic
on real directories; the end-to-end refusals are in tests/integration/test_tenancy.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.config.settings import Settings
from broker.protocol import JobSpec
from orchestrator.calls.tenancy import TenancyError, check, workspace_for


def settings(tmp_path: Path, **ceilings: object) -> Settings:
    return Settings.model_validate(
        {"workspace_root": str(tmp_path / "root"), "user_ceilings": ceilings}
    )


def spec(workspace: str, **fields: object) -> JobSpec:
    return JobSpec.model_validate(
        {"prompt": "p", "workspace": workspace, "user_id": "bob", **fields}
    )


def test_a_workspace_defaults_to_the_users_root_and_relative_paths_stay_under_it(
    tmp_path: Path,
) -> None:
    s = settings(tmp_path)
    assert workspace_for(s, "bob", "") == str(tmp_path / "root" / "bob")
    assert workspace_for(s, "bob", "proj") == str(tmp_path / "root" / "bob" / "proj")
    assert (tmp_path / "root" / "bob" / "proj").is_dir()
    for escape in ("../alice", str(tmp_path / "root" / "alice"), "/etc", "/"):
        with pytest.raises(TenancyError, match="outside user bob's roots") as refused:
            workspace_for(s, "bob", escape)
        assert refused.value.rule == "the default ceiling.workspace_roots"


def test_a_symlink_out_of_a_root_counts_as_outside(tmp_path: Path) -> None:
    s = settings(tmp_path)
    home = tmp_path / "root" / "bob"
    home.mkdir(parents=True)
    alice = tmp_path / "root" / "alice"
    alice.mkdir()
    (home / "hers").symlink_to(alice)
    with pytest.raises(TenancyError, match="outside"):
        workspace_for(s, "bob", "hers")
    with pytest.raises(TenancyError, match="outside"):
        workspace_for(s, "bob", str(home / "hers" / "deeper"))


def test_an_admin_adds_roots_per_user(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    s = settings(tmp_path, bob={"workspace_roots": [str(shared / "{user}")]})
    assert workspace_for(s, "bob", str(shared / "bob" / "x")) == str(shared / "bob" / "x")
    with pytest.raises(TenancyError, match=r"user_ceilings\.bob\.workspace_roots"):
        workspace_for(s, "bob", str(shared / "alice"))


def test_a_user_id_never_makes_a_path(tmp_path: Path) -> None:
    with pytest.raises(TenancyError, match="not a user id"):
        workspace_for(settings(tmp_path), "../etc", "")


def test_rules_and_modes_beyond_the_ceiling_are_refused_with_the_rule_named(
    tmp_path: Path,
) -> None:
    s = settings(tmp_path, bob={"allow": ["exec(git *)", "read_file"]})
    ws = str(tmp_path / "root" / "bob")
    check(spec(ws, allow=["exec(git *)", "Read(./docs/**)"]), s)  # within: passes
    with pytest.raises(TenancyError) as beyond:
        check(spec(ws, allow=["exec"]), s)
    assert beyond.value.rule == "user_ceilings.bob.allow"
    assert "the allow rule exec is beyond" in str(beyond.value)
    with pytest.raises(TenancyError) as mode:
        check(spec(ws, permission_mode="bypassPermissions"), s)
    assert mode.value.rule == "user_ceilings.bob.modes"


def test_network_and_bypass_are_granted_by_an_admin_only(tmp_path: Path) -> None:
    ws = str(tmp_path / "root" / "bob")
    plain = settings(tmp_path)
    check(spec(ws, allow=["exec", "write_file"]), plain)  # '*' by default: any tool
    with pytest.raises(TenancyError) as network:
        check(spec(ws, allow=["exec", "network"]), plain)
    assert network.value.rule == "the default ceiling.network"
    with pytest.raises(TenancyError, match="bypassPermissions"):
        check(spec(ws, permission_mode="bypassPermissions"), plain)
    granted = settings(tmp_path, bob={"network": True, "modes": ["default", "bypassPermissions"]})
    check(spec(ws, allow=["network"], permission_mode="bypassPermissions"), granted)
    everyone = settings(tmp_path, **{"*": {"allow": ["read_file"]}})
    with pytest.raises(TenancyError, match=r"user_ceilings\.\*\.allow"):
        check(spec(ws, allow=["exec"]), everyone)


def test_an_admins_job_is_not_bounded_and_a_users_job_needs_a_user(tmp_path: Path) -> None:
    s = settings(tmp_path)
    check(spec("/etc", admin=True, allow=["network"], permission_mode="bypassPermissions"), s)
    with pytest.raises(TenancyError, match="acts for a user"):
        check(spec("/tmp", user_id=""), s)
