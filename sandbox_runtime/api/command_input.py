"""What a host may hand ``Conversation.exec`` as a command's standard input, read chunk by chunk as the command
takes it: ``bytes`` (or ``bytearray``, ``memoryview``), a binary file object (anything with ``read(n)`` giving
bytes: an open file, ``io.BytesIO``, a socket's file), or an iterable of byte chunks. Text is refused: encode
it first (the command reads bytes)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol, runtime_checkable

from sandbox_runtime.errors import InvalidToolArguments

__all__ = ["CommandStdin", "input_chunks"]

_READ_CHUNK_BYTES = 256 * 1024


@runtime_checkable
class _Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


CommandStdin = bytes | bytearray | memoryview | _Readable | Iterable[bytes]


def input_chunks(stdin: CommandStdin) -> Iterator[bytes]:
    """``stdin`` as chunks of bytes (InvalidToolArguments for text, or a source that gives text)."""
    if isinstance(stdin, str):
        raise InvalidToolArguments("exec: stdin is text; encode it to bytes first (e.g. text.encode())")
    if isinstance(stdin, bytes | bytearray | memoryview):
        return iter((bytes(stdin),))
    if isinstance(stdin, _Readable):
        return _checked(iter(lambda: stdin.read(_READ_CHUNK_BYTES), b""))
    return _checked(iter(stdin))


def _checked(chunks: Iterator[object]) -> Iterator[bytes]:
    for chunk in chunks:
        if not isinstance(chunk, bytes | bytearray | memoryview):
            raise InvalidToolArguments(f"exec: stdin gave a {type(chunk).__name__}, not bytes")
        yield bytes(chunk)
