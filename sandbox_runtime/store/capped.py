"""Reading an opened results file without ever reading past its cap (the sandbox may grow the file meanwhile)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Protocol

from sandbox_runtime.errors import FileTooLarge, UnsafeFileType

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["CappedReader", "read_capped"]

_READ_CHUNK = 1 << 20


class CappedReader(io.RawIOBase):
    """The opened file read forward; raises :class:`FileTooLarge` once more than ``max_bytes`` were read.

    Wrap it in :class:`io.BufferedReader` to read lines; at most ``max_bytes + 1`` bytes are ever read.
    """

    def __init__(self, file: io.FileIO, max_bytes: int, shown: str) -> None:
        super().__init__()
        self._file, self._max_bytes, self._shown, self._got = file, max_bytes, shown, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: WriteableBuffer, /) -> int:
        with memoryview(buffer) as view, view.cast("B") as flat:
            got = self._file.readinto(flat[: self._max_bytes + 1 - self._got])
        if got is None:
            raise UnsafeFileType(f"{self._shown} would block on read; only regular files are read")
        self._got += got
        if self._got > self._max_bytes:
            raise FileTooLarge(f"{self._shown} grew past the cap of {self._max_bytes:,} bytes while it was read")
        return got


class _Reader(Protocol):
    def read(self, size: int = -1, /) -> bytes | None: ...


def read_capped(file: _Reader, max_bytes: int, *, label: str = "the file") -> bytes:
    """Read to the end of ``file``, never more than ``max_bytes + 1`` bytes; raise if it exceeds the cap."""
    if max_bytes < 0:
        raise ValueError("max_bytes must be >= 0")
    limit = max_bytes + 1
    chunks: list[bytes] = []
    got = 0
    while got < limit:
        chunk = file.read(min(limit - got, _READ_CHUNK))
        if chunk is None:
            raise UnsafeFileType(f"{label} would block on read; only regular files are read")
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    if got > max_bytes:
        raise FileTooLarge(f"{label} grew past the cap of {max_bytes} bytes while it was read")
    return b"".join(chunks)
