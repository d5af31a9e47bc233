"""The labels every sandbox container carries: what it belongs to, so that it is found, reaped and swept by label
(never by name) and a runtime uses only the sandboxes made for it."""

from __future__ import annotations

__all__ = [
    "LABEL_CONVERSATION",
    "LABEL_CREATED_AT",
    "LABEL_POLICY",
    "LABEL_POOL_SLOT",
    "LABEL_RUNTIME",
    "LABEL_STATE_DIR",
]

LABEL_RUNTIME = "io.sandbox-runtime.managed"
LABEL_CONVERSATION = "io.sandbox-runtime.conversation"
LABEL_CREATED_AT = "io.sandbox-runtime.created-at"
LABEL_POLICY = "io.sandbox-runtime.policy-hash"
LABEL_STATE_DIR = "io.sandbox-runtime.state-dir"
# a pooled sandbox's slot (instead of a conversation): the state database names the conversation that took it
LABEL_POOL_SLOT = "io.sandbox-runtime.pool-slot"
