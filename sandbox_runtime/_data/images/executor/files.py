"""One file operation as the code's uid, for the host's file methods of a conversation (``read_bytes``,
``write_bytes``, ``stat``, ``list_dir``, ``exists``, ``realpath``, ``make_dir``, ``remove``).

Usage: python -I -S files.py OPERATION PATH ROOT...

``read`` copies the file to stdout; ``write`` copies stdin to the file (created, or emptied first; its missing
parent folders made). The others print one JSON value: ``stat`` an entry ``{"name", "path", "is_dir", "size"}``
(links followed), ``list`` the entries of a folder (sorted; a broken or looping link is no folder), ``exists``
true or false, ``realpath`` the path with every link resolved; ``mkdir`` makes a folder and its parents (none if it
is there), ``remove`` removes a file, a link (itself) or a folder with everything in it.

PATH is absolute. Run as the code's uid, so the sandbox's own permissions decide, as they would for the code. Only
paths beneath a ROOT are taken (``/`` to look; the results folder and /tmp to change anything), after every link in
them is resolved: a link that leads elsewhere is refused, and so is anything but a regular file to read or write (a
FIFO would block, a device is not data).

On success it exits 0. Otherwise it exits 3 with one JSON line on stderr: ``{"errno": N or null, "refused":
REASON or null, "message": TEXT}``. Standard library only: this file runs inside the executor image.
"""

import errno
import json
import os
import shutil
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
    _parents_are_folders(path)
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


def _parents_are_folders(path):
    """A file where a parent folder should be is ENOTDIR, as the kernel says of a path through it."""
    parts = path.strip("/").split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        here = "/" + "/".join(parts[:depth])
        if os.path.lexists(here) and not os.path.isdir(here):
            raise NotADirectoryError(errno.ENOTDIR, "Not a directory", path)


def _entry(path):
    info = os.stat(path)  # links followed
    size = info.st_size if stat.S_ISREG(info.st_mode) else None
    return {
        "name": os.path.basename(path.rstrip("/")) or "/",
        "path": path,
        "is_dir": stat.S_ISDIR(info.st_mode),
        "size": size,
    }


def _listed(path, name):
    child = os.path.join(path, name)
    try:
        return _entry(child)
    except OSError:  # a broken or looping link
        return {"name": name, "path": child, "is_dir": False, "size": None}


def stat_of(path, roots):
    _resolved(path, roots)
    json.dump(_entry(path), sys.stdout)


def listing(path, roots):
    _resolved(path, roots)
    names = sorted(os.listdir(path))
    json.dump([_listed(path, name) for name in names], sys.stdout)


def exists(path, roots):
    json.dump(os.path.exists(path) and _beneath(os.path.realpath(path), roots), sys.stdout)


def realpath(path, roots):
    json.dump(os.path.realpath(path), sys.stdout)


def make_dir(path, roots):
    _parents_are_folders(path)
    _resolved(path, roots)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise FileExistsError(errno.EEXIST, "File exists", path)
    os.makedirs(path, exist_ok=True)


def remove(path, roots):
    parent = os.path.dirname(path.rstrip("/")) or "/"
    _resolved(parent, roots)
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
    else:
        shutil.rmtree(path)


OPERATIONS = {
    "read": read,
    "write": write,
    "stat": stat_of,
    "list": listing,
    "exists": exists,
    "realpath": realpath,
    "mkdir": make_dir,
    "remove": remove,
}


def main(argv):
    if len(argv) < 4 or argv[1] not in OPERATIONS or not argv[2].startswith("/"):
        _fail(errno.EINVAL, f"usage: files.py {'|'.join(OPERATIONS)} /PATH ROOT...")
    roots = [os.path.realpath(root) for root in argv[3:]]
    try:
        OPERATIONS[argv[1]](argv[2], roots)
    except OSError as exc:
        _fail(exc.errno, f"{exc.strerror}: {argv[2]!r}")


if __name__ == "__main__":
    main(sys.argv)
