"""An upstream MCP server built on the official Python SDK (2.x, its high-level ``MCPServer``), over stdio.

Run as ``python tests/upstreams/sdk_upstream.py``. Its tools return what SDK-built servers return: a ``-> str``
tool's text also as ``structuredContent: {"result": ...}`` (the SDK's wrapper), a tool with an output schema of
its own, a list of records (wrapped too), an image, an audio clip, progress reports, and a call that waits until it is
cancelled (it then writes a marker file, so a test can see the cancel arrived). The values are made by the
functions below, so a test computes what to expect with the same code.
"""

from __future__ import annotations

import io
import struct
import sys
import wave
import zlib
from pathlib import Path

import anyio
from mcp.server.mcpserver import Audio, Context, Image, MCPServer
from pydantic import BaseModel

server = MCPServer("sdk-upstream")


def lines_text(chars: int) -> str:
    """Exactly ``chars`` characters of numbered lines (the last one may be cut short)."""
    text = "\n".join(f"line {i:05d}: the quick brown fox jumps over the lazy dog" for i in range(chars // 40 + 2))
    return text[:chars]


def png_bytes(side: int) -> bytes:
    """A real ``side`` x ``side`` PNG (a grey gradient), the same bytes every time."""
    rows = b"".join(b"\x00" + bytes((x * 255 // max(side - 1, 1)) for x in range(side)) for _ in range(side))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)  # 8-bit greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def wav_bytes(samples: int) -> bytes:
    """A real mono 8 kHz WAV of ``samples`` samples (a sawtooth), the same bytes every time."""
    out = io.BytesIO()
    with wave.open(out, "wb") as clip:
        clip.setnchannels(1)
        clip.setsampwidth(1)
        clip.setframerate(8000)
        clip.writeframes(bytes(i % 256 for i in range(samples)))
    return out.getvalue()


class Frames(BaseModel):
    """A table in the ``{columns, rows}`` shape."""

    columns: list[str]
    rows: list[list[int | str | float]]


class Frame(BaseModel):
    id: int
    library: str
    size_kb: float


def frame_rows(count: int) -> list[list[int | str | float]]:
    return [[i, f"lib{i % 7}.so", i * 1.25] for i in range(count)]


@server.tool(title="Numbered lines")
def text(chars: int) -> str:
    """Exactly `chars` characters of numbered lines."""
    return lines_text(chars)


@server.tool(title="Frames as a table")
def frames(count: int) -> Frames:
    """`count` frames as {columns, rows} (an output schema of its own)."""
    return Frames(columns=["id", "library", "size_kb"], rows=frame_rows(count))


@server.tool()
def frame_list(count: int) -> list[Frame]:
    """`count` frames as a list of records (the SDK wraps it in {"result": ...})."""
    return [Frame(id=i, library=library, size_kb=size) for i, library, size in frame_rows(count)]


@server.tool()
def image(side: int) -> Image:
    """A `side` x `side` greyscale PNG."""
    return Image(data=png_bytes(side), format="png")


@server.tool()
def clip(samples: int) -> Audio:
    """A WAV clip of `samples` samples."""
    return Audio(data=wav_bytes(samples), format="wav")


@server.tool()
async def steps(count: int, ctx: Context) -> str:
    """Reports progress `count` times, then says it is done."""
    for step in range(1, count + 1):
        await ctx.report_progress(step, count, f"step {step} of {count}")
    return f"{count} steps done"


@server.tool()
async def wait_for_cancel(marker: str, ctx: Context) -> str:
    """Says it is waiting (a progress report), then waits until the call is cancelled and writes `marker`."""
    await ctx.report_progress(0, None, "waiting to be cancelled")
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        Path(marker).write_text("cancelled\n")
        raise
    return "never"


@server.tool()
def trace_context(ctx: Context) -> str:
    """The W3C ``traceparent`` the call came with in its ``_meta`` (empty when none)."""
    meta = ctx.request_context.meta or {}
    return str(meta.get("traceparent", ""))


if __name__ == "__main__":
    sys.exit(server.run())
