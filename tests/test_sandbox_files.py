"""Files a host program reads and writes in a conversation's sandbox (``Conversation.read_bytes`` / ``write_bytes``),
as a framework's file tools do: done as the code's uid, so the sandbox's permissions and quota hold, with Python's
own exceptions naming the sandbox path, and links out, FIFOs and devices refused as the file tools refuse them.
Each story runs on every backend (``subject``), left out only where a backend declares the protection.
"""

from __future__ import annotations

import io
import uuid

import pytest

from sandbox_runtime.api.runtime import Conversation
from sandbox_runtime.errors import FileTooLarge, PathOutsideResults, SandboxError, UnsafeFileType
from tests.conftest import Subject, self_checked

LARGE_BYTES = 8 * 1024 * 1024


def _conversation(subject: Subject, name: str) -> Conversation:
    return self_checked(subject.make()).conversation(f"{name}-{uuid.uuid4().hex[:8]}")


def test_bytes_written_anywhere_the_code_may_write_are_read_back_whole(subject: Subject) -> None:
    conversation = _conversation(subject, "round-trip")
    results = subject.policy.sandbox.results_mount_path
    assert conversation.write_bytes("made/on/the/way.bin", b"\x00\xffdata") == f"{results}/made/on/the/way.bin"
    assert conversation.read_bytes("made/on/the/way.bin") == b"\x00\xffdata"
    assert conversation.read_bytes(f"{results}/made/on/the/way.bin") == b"\x00\xffdata"
    assert (conversation.folders.results / "made/on/the/way.bin").read_bytes() == b"\x00\xffdata"
    large = bytes(range(256)) * (LARGE_BYTES // 256)
    conversation.write_bytes("/tmp/large.bin", io.BytesIO(large))  # streamed from a file object
    assert conversation.read_bytes("/tmp/large.bin") == large
    conversation.write_bytes("made/on/the/way.bin", (b"new" for _ in range(2)))  # emptied first, then written
    assert conversation.read_bytes("made/on/the/way.bin") == b"newnew"
    seen = conversation.exec(["cat", "made/on/the/way.bin"])  # the code sees the same file
    assert seen.stdout == b"newnew"


def test_a_large_file_streams_out_into_a_file_or_a_function_and_its_cap_and_a_failing_destination_hold(
    subject: Subject,
) -> None:
    conversation = _conversation(subject, "stream-out")
    large = bytes(range(256)) * (LARGE_BYTES // 256)
    conversation.write_bytes("large.bin", large)
    into = io.BytesIO()
    assert conversation.read_to("large.bin", into) == LARGE_BYTES
    assert into.getvalue() == large
    pieces: list[bytes] = []
    assert conversation.read_to("large.bin", pieces.append) == LARGE_BYTES
    assert len(pieces) > 1  # given as it came, piece by piece
    assert b"".join(pieces) == large
    capped = io.BytesIO()
    with pytest.raises(FileTooLarge):
        conversation.read_to("large.bin", capped, max_bytes=1024 * 1024)
    assert capped.getvalue() == large[: 1024 * 1024]  # exactly the cap, never more

    def full(piece: bytes) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(SandboxError, match="No space left") as failed:
        conversation.read_to("large.bin", full)
    assert isinstance(failed.value.__cause__, OSError)
    assert conversation.exec(["true"]).ok  # the read was cancelled; the conversation goes on
    assert [call.tool for call in conversation.calls()][-3:-1] == ["read_to", "read_to"]


def test_what_the_sandbox_refuses_comes_back_as_pythons_own_error_naming_the_path(subject: Subject) -> None:
    conversation = _conversation(subject, "errors")
    results = subject.policy.sandbox.results_mount_path
    conversation.write_bytes("folder/file.txt", b"x")
    with pytest.raises(FileNotFoundError, match=f"{results}/missing.txt"):
        conversation.read_bytes("missing.txt")
    with pytest.raises(IsADirectoryError, match=f"{results}/folder"):
        conversation.read_bytes("folder")
    with pytest.raises(IsADirectoryError):
        conversation.write_bytes("folder", b"x")
    with pytest.raises(NotADirectoryError):
        conversation.read_bytes("folder/file.txt/below")
    conversation.write_bytes("sized.bin", b"s" * 2048)
    with pytest.raises(FileTooLarge):
        conversation.read_bytes("sized.bin", max_bytes=1024)
    for outside in ("/etc/escaped", "../escape.txt", "/opt/venv/bin/escaped"):
        with pytest.raises(PathOutsideResults):
            conversation.write_bytes(outside, b"x")
    with pytest.raises(FileNotFoundError, match=r"escape\.txt"):
        conversation.read_bytes("../escape.txt")  # reads may name any file of the sandbox's own
    assert [call.status for call in conversation.calls()][-1] == "error"  # recorded, then raised


def test_permissions_are_the_code_uids_own(subject: Subject) -> None:
    subject.enforces("identity")  # the fake backend runs as this process's user (root in CI)
    conversation = _conversation(subject, "permissions")
    conversation.write_bytes("locked.txt", b"secret")
    assert conversation.exec(["chmod", "000", "locked.txt"]).ok
    with pytest.raises(PermissionError, match=r"locked\.txt"):
        conversation.read_bytes("locked.txt")
    with pytest.raises(PermissionError, match=r"locked\.txt"):
        conversation.write_bytes("locked.txt", b"changed")
    assert conversation.exec(["chmod", "500", "."]).ok  # the results folder itself made read-only by the code
    try:
        with pytest.raises(PermissionError):
            conversation.write_bytes("new.txt", b"x")
    finally:
        assert conversation.exec(["chmod", "700", "."]).ok


def test_the_sandboxs_own_files_are_read_as_its_code_reads_them(subject: Subject) -> None:
    subject.enforces("filesystem")  # the image's own files: the fake backend's are this host's
    conversation = _conversation(subject, "own-files")
    assert b"sandbox:x:10001:" in conversation.read_bytes("/etc/passwd")
    with pytest.raises(IsADirectoryError, match="/etc"):
        conversation.read_bytes("/etc")
    with pytest.raises(PermissionError):
        conversation.read_bytes("/etc/shadow")  # root's alone


def test_links_out_fifos_and_devices_are_refused_as_the_file_tools_refuse_them(subject: Subject) -> None:
    conversation = _conversation(subject, "unsafe")
    made = conversation.exec(
        ["sh", "-c", "ln -s /etc/hostname out && ln -s kept.txt in && mkfifo pipe && echo k >kept.txt"]
    )
    assert made.ok, made.stderr
    with pytest.raises(UnsafeFileType, match="link"):
        conversation.write_bytes("out", b"x")  # a write never leaves the results folder and /tmp, by a link neither
    assert conversation.read_bytes("in") == b"k\n"  # a link that stays inside is followed, as the code would
    with pytest.raises(UnsafeFileType, match="FIFO"):
        conversation.read_bytes("pipe")
    with pytest.raises(UnsafeFileType, match="FIFO"):
        conversation.write_bytes("pipe", b"x")
    with pytest.raises(UnsafeFileType, match="device"):
        conversation.read_bytes("/dev/zero")


def test_a_write_past_the_quota_fails_and_the_folder_stays_within_it(subject: Subject) -> None:
    subject.enforces("resources")  # the fake backend has no disk quota of its own
    quota = 4 * 1024 * 1024
    small = subject.policy.changed({"store": {"quota_bytes": quota}}, "the test: a small quota")
    conversation = self_checked(subject.make(small)).conversation(f"quota-{uuid.uuid4().hex[:8]}")
    with pytest.raises(OSError, match=r"space|quota") as raised:
        conversation.write_bytes("big.bin", (b"q" * 65536 for _ in range(2 * quota // 65536)))
    assert not isinstance(raised.value, PathOutsideResults)
    assert conversation.usage().used_bytes <= quota + 1024 * 1024
