"""The per-conversation disk quota holds to the byte, and a breach is reported with used and limit."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.errors import QuotaError
from sandbox_runtime.policy import policy_from_mapping
from sandbox_runtime.sandbox.docker.backend import DockerBackend
from sandbox_runtime.sandbox.labels import LABEL_STATE_DIR
from sandbox_runtime.store.quota import attached_loop_images, loop_quota_unavailable_reason, resolve_quota_mode
from tests.cli_helpers import run_cli
from tests.conftest import SESSION, TEST_LABEL, RuntimeFactory

MiB = 1 << 20

QUOTA_BYTES = 16 * 1024 * 1024
needs_root = pytest.mark.skipif(
    loop_quota_unavailable_reason() is not None and not os.environ.get("CI"),
    reason=f"kernel-enforced quotas unavailable: {loop_quota_unavailable_reason()}",
)

FILL = """
import json, os
written = 0
error = None
try:
    with open('/mnt/results/exports/fill.bin', 'wb') as handle:
        while True:
            written += handle.write(b'x' * 65536)
            handle.flush()
except OSError as exc:
    error = exc.errno
print(json.dumps({'written': written, 'errno': error, 'size': os.path.getsize('/mnt/results/exports/fill.bin')}))
"""


@needs_root
def test_filling_the_results_folder_stops_at_the_quota_with_not_one_byte_beyond(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(policy_from_mapping({"store": {"quota_bytes": QUOTA_BYTES, "quota_mode": "loop"}}))
    conversation = runtime.conversation("fill-quota")
    result = conversation.run_python(FILL)
    assert result.status == "ok", result.message
    seen = json.loads(result.stdout)
    assert seen["errno"] == 28  # ENOSPC
    assert seen["size"] <= QUOTA_BYTES
    usage = conversation.usage()
    assert usage.mode == "loop"
    assert usage.used_bytes <= usage.limit_bytes == QUOTA_BYTES
    on_host = os.stat(conversation.folders.results / "exports" / "fill.bin")
    assert on_host.st_blocks * 512 <= QUOTA_BYTES


@needs_root
def test_a_script_that_dies_on_a_full_folder_is_reported_as_quota_exceeded(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(policy_from_mapping({"store": {"quota_bytes": QUOTA_BYTES, "quota_mode": "loop"}}))
    conversation = runtime.conversation("quota-exceeded")
    result = conversation.run_python("open('/mnt/results/big.bin', 'wb').write(b'x' * (64 * 1024 * 1024))")
    assert result.status == "quota_exceeded"
    assert result.is_error
    assert result.limit_bytes == QUOTA_BYTES
    assert result.used_bytes is not None
    assert 0 < result.used_bytes <= QUOTA_BYTES
    assert f"{QUOTA_BYTES:,}" in result.message
    after = conversation.run_python("import os; os.remove('/mnt/results/big.bin'); print('freed')")
    assert after.stdout == "freed\n"


@needs_root
def test_a_sparse_terabyte_file_is_refused_by_the_filesystem(runtime_factory: RuntimeFactory) -> None:
    runtime = runtime_factory(policy_from_mapping({"store": {"quota_bytes": QUOTA_BYTES, "quota_mode": "loop"}}))
    conversation = runtime.conversation("sparse-file")
    result = conversation.run_python(
        "import os\nfd = os.open('/mnt/results/sparse.bin', os.O_WRONLY | os.O_CREAT)\n"
        "try:\n    os.ftruncate(fd, 1 << 40)\n    print('truncated')\nexcept OSError as e:\n    print(e.errno)\n"
    )
    # ext4 refuses a 1 TiB file size (EFBIG) or RLIMIT_FSIZE does; either way nothing is allocated
    assert result.stdout.strip() in {"27", "truncated"} or result.status == "error"
    assert conversation.usage().used_bytes < QUOTA_BYTES


@needs_root
def test_the_quota_filesystem_is_mounted_again_after_a_runtime_restart(
    runtime_factory: RuntimeFactory,
) -> None:
    policy = policy_from_mapping({"store": {"quota_bytes": QUOTA_BYTES, "quota_mode": "loop"}})
    first = runtime_factory(policy)
    conversation = first.conversation("remount")
    conversation.run_python("open('/mnt/results/kept.txt', 'w').write('kept')")
    conversation.close()
    os.system(f"umount {conversation.folders.results}")  # noqa: S605  (as after a reboot of the host)
    assert not os.path.ismount(first.store.folders("remount").results)
    second = runtime_factory(policy, state_dir=first.state_dir)
    again = second.conversation("remount")
    assert again.run_python("print(open('/mnt/results/kept.txt').read())").stdout == "kept\n"
    assert os.path.ismount(again.folders.results)


def test_measured_mode_reports_every_run_that_leaves_the_folder_over_the_quota(
    runtime_factory: RuntimeFactory,
) -> None:
    runtime = runtime_factory(policy_from_mapping({"store": {"quota_bytes": 1024 * 1024, "quota_mode": "measured"}}))
    conversation = runtime.conversation("measured")
    over = conversation.run_python("open('/mnt/results/big.bin', 'wb').write(b'x' * (2 * 1024 * 1024))")
    assert over.status == "quota_exceeded"
    assert over.used_bytes is not None
    assert over.limit_bytes is not None
    assert over.used_bytes > over.limit_bytes == 1024 * 1024
    still_over = conversation.run_python("print('runs, so the model can clean up')")
    assert still_over.status == "quota_exceeded"
    cleaned = conversation.run_python("import os; os.remove('/mnt/results/big.bin')")
    assert cleaned.status == "ok"


def test_a_policy_that_demands_loop_quotas_fails_clearly_where_they_are_impossible(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(QuotaError, match="not running as root"):
        resolve_quota_mode("loop")
    assert resolve_quota_mode("auto") == "measured"


def _attached_under(state_dir: Path) -> list[str]:
    """Loop devices whose backing file lies in this state directory."""
    volumes = os.path.realpath(state_dir / "volumes") + os.sep
    return sorted(
        device for image, devices in attached_loop_images().items() if image.startswith(volumes) for device in devices
    )


@needs_root
def test_gc_after_a_crash_leaves_no_loop_device_of_the_state_directory_attached(
    runtime_factory: RuntimeFactory, docker_backend: DockerBackend, executor_image: str, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    policy = policy_from_mapping({"store": {"quota_bytes": QUOTA_BYTES, "quota_mode": "loop"}})
    crashed = Runtime(
        state,
        policy,
        image=executor_image,
        extra_labels={TEST_LABEL: SESSION},
        reap_interval_s=None,
        retention_interval_s=None,
    )
    names = [f"past-{i:02d}" for i in range(20)]
    try:
        for name in names[:2]:
            written = crashed.conversation(name).run_python(f"open('/mnt/results/{name}.txt', 'w').write('{name}')")
            assert written.status == "ok", written.message
        for name in names[2:]:
            outcome = crashed.conversation(name).call("write_file", {"path": f"{name}.txt", "content": name})
            assert not outcome.is_error, outcome
    finally:
        # a crash: the process ends without closing (its lease counts as gone), its sandboxes and mounts stay;
        # then the engine loses the sandboxes
        crashed.workers.close()
        crashed.manager.end_lease()
        crashed.backend.close()
        crashed.state.close()
    for info in docker_backend.list_containers({TEST_LABEL: SESSION, LABEL_STATE_DIR: str(state.resolve())}):
        docker_backend.remove(info.id)
    assert len(_attached_under(state)) == 20
    done = run_cli("--state-dir", str(state), "--policy", "default", "gc")
    assert done.returncode == 0, done.stderr
    assert _attached_under(state) == []
    assert not any(os.path.ismount(state / "conversations" / name / "results") for name in names)
    later = runtime_factory(policy, state_dir=state)
    assert later.conversation("past-00").run_python("print(open('/mnt/results/past-00.txt').read())").stdout == (
        "past-00\n"
    )
    assert later.conversation("past-19").call("read_file", {"path": "past-19.txt"}).text.endswith("past-19")


@pytest.mark.skipif(loop_quota_unavailable_reason() is not None, reason="loop quotas need root and mkfs.ext4")
def test_a_new_conversations_volume_takes_under_2_mib_of_host_disk_until_the_sandbox_writes(
    fake_runtime_factory: RuntimeFactory,
) -> None:
    conversation = fake_runtime_factory(policy_from_mapping({"store": {"quota_mode": "loop"}})).conversation("small")
    folders = conversation.folders
    assert folders.quota_bytes >= 1 << 30  # a 1 GiB filesystem (the default quota)
    assert folders.volume.stat().st_blocks * 512 < 2 * MiB  # mounted: the inode tables and journal are not made yet
    conversation.close()  # released: unmounted, the loop device detached
    assert not os.path.ismount(folders.results)
    assert folders.volume.stat().st_blocks * 512 < 2 * MiB
    written = conversation.run_python("open('data.bin', 'wb').write(b'x' * (8 << 20))")
    assert written.status == "ok", written.message
    conversation.close()  # unmounted: everything written has reached the image
    grown = folders.volume.stat().st_blocks * 512
    assert 8 * MiB <= grown < 8 * MiB + 4 * MiB  # what was written, and a few MiB of metadata and journal
