"""attach_file: a report leaves the sandbox as a plain download that outlives the results folder's cleanup."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

from sandbox_runtime import Runtime

BUILD = """\
from openpyxl import Workbook
book = Workbook()
book.active.append(["region", "revenue"])
book.active.append(["north", 1234.5])
book.save("/mnt/results/exports/summary.xlsx")
"""


def test_a_built_report_is_attached_as_a_plain_0644_copy_that_survives_retention(runtime: Runtime) -> None:
    conversation = runtime.conversation("attach")
    assert not conversation.call("run_python", {"code": BUILD}).is_error
    source = conversation.folders.results / "exports" / "summary.xlsx"
    os.chmod(source, 0o4755)  # noqa: S103  (a setuid bit the sandbox set must not travel)
    out = conversation.call("attach_file", {"path": "/mnt/results/exports/summary.xlsx", "filename": "Q4 summary.xlsx"})
    assert not out.is_error, out.text
    [card] = conversation.attachments()
    copy = Path(card.host_path)
    assert card.filename == "Q4 summary.xlsx"
    assert card.mime_type == "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    assert card.bytes == source.stat().st_size
    assert card.sha256 == hashlib.sha256(source.read_bytes()).hexdigest()
    st = copy.lstat()
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o644
    assert st.st_nlink == 2  # its own name and its content's, both in outputs/ (the content is stored once)
    [content] = (conversation.folders.outputs / ".blobs").iterdir()
    assert content.name == card.sha256
    assert os.path.samestat(content.stat(), st)
    assert not os.path.samestat(source.stat(), st)  # a copy, never a link to the sandbox's file
    assert conversation.folders.outputs in copy.parents
    assert card.attachment_id in out.text
    assert "download" in out.text
    runtime.expire_files(now=time.time() + 30 * 86400)
    assert copy.read_bytes() == source.read_bytes()


def test_links_fifos_and_missing_files_are_not_attached(runtime: Runtime, tmp_path: Path) -> None:
    conversation = runtime.conversation("attach-bad")
    results = conversation.folders.results
    (tmp_path / "host-secret").write_text("secret")
    os.symlink(tmp_path / "host-secret", results / "exports" / "link.txt")
    os.mkfifo(results / "exports" / "pipe.txt")
    for name, error in (("link.txt", "UnsafeFileType"), ("pipe.txt", "UnsafeFileType"), ("none.txt", "PathNotFound")):
        out = conversation.call("attach_file", {"path": f"exports/{name}"})
        assert out.is_error, out.text
        assert error in out.text, out.text
    assert conversation.attachments() == []
    assert not any(conversation.folders.outputs.rglob("*.txt"))
