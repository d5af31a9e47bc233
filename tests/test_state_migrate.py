"""An operator moves a state directory from its SQLite file to a PostgreSQL server (``state migrate``): every
decision replays byte for byte afterwards, nothing runs again, and a migration that cannot be done changes
nothing. On the fake backend (no engine) and a real private PostgreSQL server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.cli.main import main
from sandbox_runtime.errors import StateUnavailable
from sandbox_runtime.models import StoredResult
from tests.conftest import RuntimeFactory

pytestmark = pytest.mark.postgresql

ROWS = "\n".join(f"{n},part-{n}.so.{n % 7},\udcff" for n in range(400))


def _work(policy: Path, state: Path) -> tuple[list[StoredResult], str]:
    """A conversation with decisions worth keeping: a spilled result, a host result, a failure, and one of another
    tenant under the same id (by a runtime that is closed afterwards; the test's own runtimes delete what it
    made); the decisions, and the audit trail's head hash."""
    runtime = Runtime(state, policy, reap_interval_s=None, retention_interval_s=None)
    conversation = runtime.conversation("kept")
    conversation.call("run_python", {"code": f"print({ROWS!r})"}, call_id="spilled")
    conversation.submit("host_tool", "from-the-host", {"rows": ROWS.splitlines()[:50]})
    conversation.call("read_file", {"path": "no/such/file.csv"}, call_id="failed")
    runtime.conversation("kept", tenant="acme").submit("host_tool", "acme-1", "acme's own")
    decisions = conversation.decisions()
    head = runtime.state.audit.verify().head_hash
    runtime.close()
    return decisions, head


def test_a_migrated_state_replays_every_decision_byte_for_byte_and_runs_nothing_again(
    postgres_url: str,
    fake_runtime_factory: RuntimeFactory,
    fake_policy_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state = tmp_path / "state"
    before, head = _work(fake_policy_file, state)
    assert len(before) == 3

    code = main(
        ["--state-dir", str(state), "--policy", str(fake_policy_file), "state", "migrate", "--to", postgres_url]
    )
    said = capsys.readouterr()
    assert code == 0, said.err
    assert "decisions read back the same" in said.out
    assert (
        postgres_url.split(":")[2].split("@", maxsplit=1)[0] not in said.out + said.err
    )  # the password is never shown
    assert not (state / "state.sqlite3").exists()
    assert list(state.glob("state.sqlite3.migrated-*"))  # set aside, kept

    with pytest.raises(StateUnavailable, match="lives on postgresql://sandbox:\\*\\*\\*@"):
        fake_runtime_factory(state_dir=state)  # without the server's URL: refused, never a fresh empty state
    runtime = fake_runtime_factory(state_dir=state, state_url=postgres_url)
    conversation = runtime.conversation("kept")
    assert conversation.decisions() == before
    again = conversation.call("run_python", {"code": "print('never run')"}, call_id="spilled")
    assert again.replayed
    assert again.text == before[0].text  # byte for byte, surrogate and all
    assert [c.call_id for c in conversation.calls()] == ["spilled", "from-the-host", "failed"]
    assert [d.call_id for d in runtime.conversation("kept", tenant="acme").decisions()] == ["acme-1"]
    check = runtime.state.audit.verify(head=head)  # the chain moved whole, and goes on from its head
    assert check.ok, check
    assert check.entries > 4


def test_a_migration_into_a_database_holding_state_changes_nothing(
    postgres_url: str,
    fake_runtime_factory: RuntimeFactory,
    fake_policy_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    theirs = fake_runtime_factory(state_dir=tmp_path / "other", state_url=postgres_url).conversation("theirs")
    theirs.submit("host_tool", "theirs-1", "a decision of theirs")
    state = tmp_path / "state"
    before, _head = _work(fake_policy_file, state)
    args = ["--state-dir", str(state), "--policy", str(fake_policy_file), "state", "migrate", "--to", postgres_url]
    assert main([*args, "--json"]) == 1
    assert "holds state already" in capsys.readouterr().err
    runtime = fake_runtime_factory(state_dir=state)  # still the SQLite state, as it was
    assert runtime.conversation("kept").decisions() == before
    assert main(args) == 1  # and never while a runtime uses it
    assert "in use by pid" in capsys.readouterr().err


def test_doctor_names_the_store_and_its_schema_version(
    postgres_url: str,
    fake_policy_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SANDBOX_RUNTIME_STATE_URL", postgres_url)
    main(["--state-dir", str(tmp_path / "state"), "--policy", str(fake_policy_file), "doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert report["audit"]["ok"]
    assert report["audit"]["lost_entries"] == 0
    shown = report["state"]
    assert shown["store"] == "postgresql"
    assert shown["where"].startswith("postgresql://sandbox:***@127.0.0.1:")
    assert shown["schema_version"] >= 4
    monkeypatch.delenv("SANDBOX_RUNTIME_STATE_URL")
    main(["--state-dir", str(tmp_path / "embedded"), "--policy", str(fake_policy_file), "doctor"])  # SQLite
    said = capsys.readouterr().out
    assert f"records on sqlite {tmp_path / 'embedded' / 'state.sqlite3'} (schema version" in said
    assert "audit    whole: " in said
