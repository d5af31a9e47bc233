"""A sandbox belongs to what shapes it, not to the server that made it. An operator runs replicas on other ports
and hosts, gives one its database in the policy and another by the environment, restarts a server on another port:
every one of them takes any call of any conversation in the sandbox already there. Only a change that shapes the
sandbox (image, protections, limits, mounts, runtime) makes a new one, and a runtime under it still refuses a
sandbox another live runtime holds under the old shape, with the message it always gave."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from sandbox_runtime.policy import MiB, load_policy
from sandbox_runtime.sandbox.profile import sandbox_identity
from sandbox_runtime.state.location import STATE_URL_VARIABLE
from tests.conftest import RuntimeFactory, database_name
from tests.local_servers import free_port
from tests.mcp_helpers import serve_command, serve_process, stop_by_pid, text_of
from tests.postgres_cluster import PostgresCluster
from tests.test_replicas import Replica, call, start_lines

IMAGE = "sandbox-runtime-executor:0123456789abcdef"

NOT_THE_SANDBOX: list[dict[str, Any]] = [
    {"name": "replica-b"},
    {"mcp": {"http_host": "127.0.0.2", "http_port": 44081}},
    {"mcp": {"auth": {"issuer": "https://issuer.invalid", "audience": "sr", "jwks_file": "/etc/sr/jwks.json"}}},
    {"state": {"url": "postgresql://state.invalid/sandbox", "call_wait_s": 30}},
    {"telemetry": {"sandbox_spans_max_count": 10}},
    {"admission": {"tenant_runs_max": 2}},
    {"pool": {"ready_count": 4}},
    {"spill": {"threshold_chars": 5000}},
    {"tools": {"render_rows_max": 50}},
    {"run": {"default_timeout_s": 5}},
    {"approval": {"default_rule": "deny"}},
]

SHAPES_THE_SANDBOX: list[dict[str, Any]] = [
    {"sandbox": {"runtime": "runsc"}},
    {"sandbox": {"uid": 10005, "gid": 10005}},
    {"sandbox": {"results_mount_path": "/mnt/work"}},
    {"sandbox": {"limits": {"memory_bytes": 256 * MiB}}},
    {"sandbox": {"limits": {"cpus": 2.0}}},
    {"sandbox": {"limits": {"pids_max": 512}}},
    {"sandbox": {"limits": {"tmpfs_bytes": 128 * MiB}}},
    {"sandbox": {"limits": {"open_files_max": 2048}}},
]


@pytest.mark.parametrize("changes", NOT_THE_SANDBOX, ids=lambda changes: ".".join(_path(changes)))
def test_what_never_reaches_the_container_leaves_the_sandbox_identity_alone(changes: dict[str, Any]) -> None:
    base = load_policy("default")
    changed = base.changed(changes, "a replica's policy")
    assert changed.digest() != base.digest()  # another policy...
    assert sandbox_identity(changed, IMAGE) == sandbox_identity(base, IMAGE)  # ...the same sandbox


@pytest.mark.parametrize("changes", SHAPES_THE_SANDBOX, ids=lambda changes: ".".join(_path(changes)))
def test_what_shapes_the_sandbox_changes_its_identity(changes: dict[str, Any]) -> None:
    base = load_policy("default")
    assert sandbox_identity(base.changed(changes, "a new shape"), IMAGE) != sandbox_identity(base, IMAGE)


def test_another_image_is_another_sandbox() -> None:
    policy = load_policy("default")
    assert sandbox_identity(policy, IMAGE) != sandbox_identity(policy, IMAGE.replace("0123", "3210"))


def _path(changes: dict[str, Any]) -> list[str]:
    key, value = next(iter(changes.items()))
    return [key, *(_path(value) if isinstance(value, dict) else [])]


# --------------------------------------------------------------------- replicas and restarts, real engines
ENGINES = [
    pytest.param("default", id="docker", marks=pytest.mark.docker),
    pytest.param("podman", id="podman", marks=[pytest.mark.docker, pytest.mark.podman]),
]
ENGINE_POLICY_TEXT = {"default": "", "podman": '[sandbox]\nbackend = "podman"\n'}
SANDBOX_NAME = (  # a name the sandbox's first run gives it in its own /tmp (a tmpfs of each container's own)
    "import os, secrets\nif not os.path.exists('/tmp/name'):\n    open('/tmp/name', 'w').write(secrets.token_hex(8))\n"
    "print('sandbox', open('/tmp/name').read())"
)


@contextmanager
def replica(state: Path, policy: Path, database_url: str | None = None) -> Iterator[Replica]:
    """``serve --http`` on a port of its own (named, not 0) on the shared state folder; the database URL in the
    environment when given (else the policy names it); stopped by pid afterwards."""
    environment = {**os.environ}
    environment.pop(STATE_URL_VARIABLE, None)
    environment.pop("SANDBOX_RUNTIME_MCP_TOKEN", None)
    if database_url is not None:
        environment[STATE_URL_VARIABLE] = database_url
    command = serve_command(state, "--http", f"127.0.0.1:{free_port()}", policy=policy)
    with serve_process(command, env=environment) as (process, lines):
        started = Replica(process, *start_lines(lines))
        try:
            yield started
        finally:
            stop_by_pid(process)


def sandbox_of(replica: Replica, call_id: str) -> str:
    said = text_of(call(replica, SANDBOX_NAME, call_id))
    found = re.search(r"^sandbox ([0-9a-f]{16})$", said, re.MULTILINE)
    assert found, said
    return found.group(1)


@pytest.mark.first
@pytest.mark.postgresql
@pytest.mark.parametrize("engine_policy", ENGINES)
def test_replicas_on_other_ports_and_a_restart_on_a_new_port_use_the_conversations_one_sandbox(
    engine_policy: str,
    postgres_cluster: PostgresCluster,
    postgres_url: str,
    docker_runtime_factory: RuntimeFactory,
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    engine = ENGINE_POLICY_TEXT[engine_policy]
    by_environment = tmp_path / "url-by-environment.toml"
    by_environment.write_text(engine)
    in_policy = tmp_path / "url-in-policy.toml"
    in_policy.write_text(f'{engine}[state]\nurl = "{postgres_cluster.socket_url(database_name(postgres_url))}"\n')
    reshaped = tmp_path / "more-memory.toml"
    reshaped.write_text(f"{engine}[sandbox.limits]\nmemory_bytes = {256 * MiB}\n")
    try:
        with (
            replica(state, by_environment, postgres_url) as one,
            replica(state, in_policy) as two,
        ):
            first = sandbox_of(one, "on-one")
            assert sandbox_of(two, "on-two") == first  # another port, the URL given another way: the same sandbox
            assert sandbox_of(one, "on-one-again") == first

        with replica(state, by_environment, postgres_url) as restarted:  # a restart on a third port
            assert not any("removed sandbox" in line for line in restarted.said)
            assert sandbox_of(restarted, "after-restart") == first  # re-attached, not replaced

            with replica(state, reshaped, postgres_url) as other_shape:  # less memory: another sandbox
                refused = call(other_shape, SANDBOX_NAME, "other-shape")
                assert refused.is_error
                said = text_of(refused)
                assert "is in use by another runtime" in said
                assert "cannot use: made under another policy" in said
    finally:
        docker_runtime_factory(state_dir=state, state_url=postgres_url)
