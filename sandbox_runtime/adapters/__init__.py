"""Doors for the agent frameworks hosts already use: each adapter implements one framework's own sandbox contract
over a :class:`~sandbox_runtime.Conversation` (its commands, its files, its lifecycle), so the framework's shell and
file tools run in the hardened sandbox, on the conversation's results folder, beside the model's own tools.

Each is an optional extra (``pip install 'sandbox-runtime[inspect]'``, ...), imported only by its framework, and
exposes the conversation id, so the same conversation is also reachable over MCP. What no adapter can offer is
declared in one place per adapter, never faked: one non-root uid; no network, ports or mounts; no process outlives
a call; a read-only root and a ``noexec`` ``/tmp``; calls in one conversation are serialised.
"""
