"""The reference MCP server, ``@modelcontextprotocol/server-everything`` (Node, from npm), behind the gateway.

scripts/setup-dev.sh installs it into .npm-tools. An MCP client (the SDK's own) drives ``sandbox-runtime serve
--upstream everything=...`` and sees what the upstream sent, in the form this server gives it: images and
embedded resources saved as files of the conversation's results folder (same bytes) and linked, annotations
kept, the upstream's own resource links and structured results passed on, its progress heard during a call.
None of it starts a sandbox: ``serve`` runs on the fake backend, with no engine.
Without the server the test skips on a developer's machine and fails in CI.
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from tests.conftest import RuntimeFactory
from tests.mcp_helpers import links_of, run_bounded, stdio_params, text_of

EVERYTHING = Path(__file__).resolve().parent.parent / ".npm-tools" / "node_modules" / ".bin" / "mcp-server-everything"

if not EVERYTHING.exists():
    if os.environ.get("CI"):
        raise RuntimeError(f"{EVERYTHING} is missing: scripts/setup-dev.sh installs it")
    pytest.skip("server-everything is not installed (run scripts/setup-dev.sh)", allow_module_level=True)

SAVED = re.compile(
    r"\[(?P<what>[^\]]*?) saved as (?P<path>/mnt/results/spill/\S+): (?P<mime>\S+), (?P<bytes>[\d,]+) bytes\]"
)


def saved_files(text: str) -> list[dict[str, str]]:
    """The files the text names as saved: what, in-sandbox path, MIME type, bytes."""
    return [match.groupdict() for match in SAVED.finditer(text)]


async def upstream_tiny_image() -> bytes:
    """The image server-everything sends, asked directly (not through the gateway)."""
    params = StdioServerParameters(command=str(EVERYTHING), args=["stdio"])
    async with Client(params, mode="legacy") as client:
        sent = await client.call_tool("get-tiny-image", {})
    (image,) = [block for block in sent.content if isinstance(block, types.ImageContent)]
    return base64.b64decode(image.data)


async def read_blob(client: Client, uri: str) -> bytes:
    (contents,) = (await client.read_resource(uri)).contents
    if isinstance(contents, types.BlobResourceContents):
        return base64.b64decode(contents.blob)
    assert isinstance(contents, types.TextResourceContents)
    return contents.text.encode()


@pytest.mark.process
def test_an_mcp_client_gets_server_everythings_images_resources_annotations_and_progress_through_the_gateway(
    fake_runtime_factory: RuntimeFactory, fake_served_state: Path, fake_policy_file: Path
) -> None:
    # the gateway starts no sandbox: it is served on the fake backend, with no engine
    params = stdio_params(fake_served_state, "--upstream", f"everything={EVERYTHING} stdio", policy=fake_policy_file)

    async def scenario() -> dict[str, Any]:
        seen: dict[str, Any] = {"sent_image": await upstream_tiny_image()}
        async with Client(params, read_timeout_seconds=120) as client:
            seen["tools"] = {tool.name: tool for tool in (await client.list_tools()).tools}
            image = seen["image"] = await client.call_tool("everything__get-tiny-image", {})
            seen["image_file"] = await read_blob(client, links_of(image)[0].uri)
            seen["annotated"] = await client.call_tool(
                "everything__get-annotated-message", {"messageType": "error", "includeImage": True}
            )
            blob = seen["blob"] = await client.call_tool(
                "everything__get-resource-reference", {"resourceType": "Blob", "resourceId": 2}
            )
            seen["blob_file"] = await read_blob(client, links_of(blob)[0].uri)
            text = seen["text"] = await client.call_tool(
                "everything__get-resource-reference", {"resourceType": "Text", "resourceId": 1}
            )
            seen["text_file"] = await read_blob(client, links_of(text)[0].uri)
            seen["links"] = await client.call_tool("everything__get-resource-links", {"count": 3})
            seen["weather"] = await client.call_tool("everything__get-structured-content", {"location": "Chicago"})

            heard: list[tuple[float, float | None, str | None]] = []

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                heard.append((progress, total, message))

            seen["long"] = await client.call_tool(
                "everything__trigger-long-running-operation",
                {"duration": 1, "steps": 4},
                progress_callback=on_progress,
            )
            seen["heard"] = list(heard)  # what had arrived when the call returned
        return seen

    seen = run_bounded(scenario)

    # tools keep their titles and annotations
    echo = seen["tools"]["everything__echo"]
    assert echo.title == "Echo Tool"
    assert echo.annotations is not None
    assert echo.annotations.read_only_hint is True

    # the image: saved with the bytes the upstream sent, named in the text, linked with its type and size
    image = seen["image"]
    assert not image.is_error, text_of(image)
    text = text_of(image)
    assert text.startswith(
        "Here's the image you requested:\n[image saved as /mnt/results/spill/everything__get-tiny-image-"
    )
    assert text.endswith("The image above is the MCP logo.")
    (saved,) = saved_files(text)
    assert saved["mime"] == "image/png"
    assert int(saved["bytes"].replace(",", "")) == len(seen["sent_image"])
    assert seen["image_file"] == seen["sent_image"]
    (link,) = links_of(image)
    assert (link.mime_type, link.size) == ("image/png", len(seen["sent_image"]))
    assert link.uri.startswith("sandbox-runtime://conversations/")
    assert link.uri.endswith(saved["path"].removeprefix("/mnt/results/"))
    conversation_id = link.uri.split("/")[3]
    runtime = fake_runtime_factory(state_dir=fake_served_state)
    root = runtime.store.results_root(runtime.conversation(conversation_id).folders)
    assert root.read_bytes(saved["path"], max_bytes=1 << 20) == seen["sent_image"]  # on disk, where the text says

    # annotations: the text block keeps the upstream text's, the image's link keeps the image's
    annotated = seen["annotated"]
    first = annotated.content[0]
    assert isinstance(first, types.TextContent)
    assert first.text.startswith("Error: Operation failed\n[image saved as ")
    assert first.annotations is not None
    assert (first.annotations.audience, first.annotations.priority) == (["user", "assistant"], 1.0)
    (image_link,) = links_of(annotated)
    assert image_link.annotations is not None
    assert (image_link.annotations.audience, image_link.annotations.priority) == (["user"], 0.5)

    # embedded resources: saved (a blob decoded, a text as it is), named and linked
    (blob_saved,) = saved_files(text_of(seen["blob"]))
    assert blob_saved["what"] == "resource demo://resource/dynamic/blob/2"
    assert seen["blob_file"].startswith(b"Resource 2: This is a base64 blob")
    assert int(blob_saved["bytes"]) == len(seen["blob_file"])
    (text_saved,) = saved_files(text_of(seen["text"]))
    resource_text = seen["text_file"].decode()
    assert resource_text.startswith("Resource 1: This is a plaintext resource")
    assert f"{text_saved['path']}: text/plain, {len(seen['text_file'])} bytes]\n{resource_text}\n" in text_of(
        seen["text"]
    )

    # the upstream's own resource links are passed on as they are, and named in the text
    links = seen["links"]
    passed = [link for link in links_of(links) if link.uri.startswith("demo://")]
    assert len(passed) == 3
    assert all(f"[resource_link {link.uri}: {link.name}" in text_of(links) for link in passed)

    # an upstream's own structured result reaches the client as it is
    assert seen["weather"].structured_content == {
        "temperature": 36,
        "conditions": "Light rain / drizzle",
        "humidity": 82,
    }

    # progress reached the client during the long-running call
    long = seen["long"]
    assert not long.is_error, text_of(long)
    assert "Long running operation completed" in text_of(long)
    assert [(progress, total) for progress, total, _ in seen["heard"]] == [
        (1.0, 4.0),
        (2.0, 4.0),
        (3.0, 4.0),
        (4.0, 4.0),
    ]
