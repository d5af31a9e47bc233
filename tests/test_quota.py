"""The per-conversation disk quota holds to the byte, and a breach is reported with used and limit."""

from __future__ import annotations

import json
import os

import pytest

from sandbox_runtime.errors import QuotaError
from sandbox_runtime.policy import policy_from_mapping
from sandbox_runtime.store.quota import loop_quota_unavailable_reason, resolve_quota_mode
from tests.conftest import RuntimeFactory

pytestmark = pytest.mark.docker

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
    assert over.used_bytes > over.limit_bytes == 1024 * 1024  # type: ignore[operator]
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
