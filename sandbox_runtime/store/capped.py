"""A raw reader over an opened results file that never reads more than its cap (the file may grow meanwhile)."""

from __future__ import annotations

import io
from typing import TYPE_CHECKING

from sandbox_runtime.errors import FileTooLarge, UnsafeFileType

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["CappedReader"]


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
