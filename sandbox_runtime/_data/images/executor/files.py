"""Reading and writing one file as the code's uid, for the host's ``Conversation.read_bytes`` / ``write_bytes``.

Usage: python -I -S files.py read|write PATH ROOT...

``read`` copies the file to stdout; ``write`` copies stdin to the file (created, or emptied first; its missing
parent folders made). PATH is absolute. Run as the code's uid, so the sandbox's own permissions decide, as they
would for the code. Only paths beneath a ROOT are taken (``/`` for a read; the results folder and /tmp for a
write), after every link in them is resolved: a link that leads elsewhere is refused, and so is anything but a
regular file (a FIFO would block, a device is not data).

On success it exits 0. Otherwise it exits 3 with one JSON line on stderr: ``{"errno": N or null, "refused":
REASON or null, "message": TEXT}``. Standard library only: this file runs inside the executor image.
"""

import errno
import json
import os
import stat
import sys

CHUNK = 256 * 1024
FAILED_EXIT = 3


def _fail(number, message, refused=None):
    sys.stderr.write(json.dumps({"errno": number, "refused": refused, "message": message}) + "\n")
    sys.exit(FAILED_EXIT)


def _beneath(path, roots):
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _resolved(path, roots):
    real = os.path.realpath(path)
    if not _beneath(real, roots):
        if _beneath(os.path.normpath(path), roots):
            _fail(None, f"{path} leads through a link to {real}, outside {' and '.join(roots)}", "link_out")
        _fail(None, f"{path} is outside {' and '.join(roots)}", "outside")
    return real


def _regular(fd, path):
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        _fail(errno.EISDIR, f"Is a directory: {path!r}")
    if not stat.S_ISREG(mode):
        _fail(None, f"{path} is not a regular file (a FIFO, socket or device)", "not_regular")


def _copy(source, target):
    while True:
        chunk = os.read(source, CHUNK)
        if not chunk:
            return
        view = memoryview(chunk)
        while view:
            view = view[os.write(target, view) :]


def read(path, roots):
    real = _resolved(path, roots)
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    _regular(fd, path)
    os.set_blocking(fd, True)
    _copy(fd, 1)


def write(path, roots):
    parent, name = os.path.split(path)
    if not name:
        _fail(errno.EISDIR, f"Is a directory: {path!r}")
    _resolved(parent, roots)  # checked before anything is made
    os.makedirs(parent, exist_ok=True)
    real = os.path.join(_resolved(parent, roots), name)
    if os.path.islink(real):
        real = _resolved(real, roots)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(real, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            _fail(None, f"{path} is not a regular file (a FIFO, socket or device)", "not_regular")
        raise
    _regular(fd, path)
    os.set_blocking(fd, True)
    os.ftruncate(fd, 0)
    _copy(0, fd)
    os.close(fd)


def main(argv):
    if len(argv) < 4 or argv[1] not in ("read", "write") or not argv[2].startswith("/"):
        _fail(errno.EINVAL, "usage: files.py read|write /PATH ROOT...")
    roots = [os.path.realpath(root) for root in argv[3:]]
    try:
        (read if argv[1] == "read" else write)(argv[2], roots)
    except OSError as exc:
        _fail(exc.errno, f"{exc.strerror}: {argv[2]!r}")


if __name__ == "__main__":
    main(sys.argv)
