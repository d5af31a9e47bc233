"""Conversation ids and the tenants they belong to.

A **tenant** is whoever a request comes from: an OAuth access token's tenant claim over HTTP, or
:data:`DEFAULT_TENANT` (the Python API's default, stdio, a static bearer token). A tenant names any conversation
id it likes (1-64 characters of ``[A-Za-z0-9_-]``); the runtime keeps it under a **conversation key** that holds
the tenant, and every layer below the interfaces (folders, sandboxes, records, tasks, attachments) knows the
conversation by its key only. So there is no lookup that forgets the tenant: the same id of two tenants is two
keys, and no id a tenant can send spells another tenant's key (a key of a tenant other than the default has a
``.``, which no id may hold).

- The default tenant's key is the id itself (a state made before tenants keeps its conversations).
- Any other tenant's key is ``<tag>.<id>``, the tag being ``t`` and 20 hex digits of the tenant's SHA-256: a
  folder name, a label value, never the tenant's own spelling (an email, an issuer's subject).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

from sandbox_runtime.errors import InvalidConversationId, InvalidTenant

__all__ = [
    "CONVERSATION_ID_MAX_CHARS",
    "DEFAULT_TENANT",
    "TENANT_MAX_CHARS",
    "conversation_key",
    "key_id",
    "key_tag",
    "tenant_tag",
    "validate_conversation_id",
    "validate_conversation_key",
    "validate_tenant",
]

DEFAULT_TENANT = "default"
CONVERSATION_ID_MAX_CHARS = 64
TENANT_MAX_CHARS = 256
_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_TAG_PATTERN = re.compile(r"t[0-9a-f]{20}")
_TAG_HEX_DIGITS = 20  # 80 bits: two tenants share a tag after ~10^12 tenants (birthday bound), never in practice


def validate_conversation_id(conversation_id: object) -> str:
    """Return the id when it is 1-64 characters of ``[A-Za-z0-9_-]`` starting with a letter or digit."""
    if not isinstance(conversation_id, str):
        raise InvalidConversationId(f"a conversation id must be a string, not {type(conversation_id).__name__}")
    if not conversation_id:
        raise InvalidConversationId("a conversation id must not be empty")
    if len(conversation_id) > CONVERSATION_ID_MAX_CHARS:
        raise InvalidConversationId(
            f"a conversation id has at most {CONVERSATION_ID_MAX_CHARS} characters; this one has {len(conversation_id)}"
        )
    if not _ID_PATTERN.fullmatch(conversation_id):
        raise InvalidConversationId(
            f"conversation id {conversation_id!r} may only hold A-Z, a-z, 0-9, '_' and '-', and must start "
            "with a letter or digit"
        )
    return conversation_id


def validate_tenant(tenant: object) -> str:
    """Return the tenant when it is a non-empty string of at most 256 printable characters (no control or
    format characters, no surrounding white space): :class:`~sandbox_runtime.errors.InvalidTenant` otherwise."""
    if not isinstance(tenant, str):
        raise InvalidTenant(f"a tenant must be a string, not {type(tenant).__name__}")
    if not tenant or tenant.strip() != tenant:
        raise InvalidTenant("a tenant must not be empty nor start or end with white space")
    if len(tenant) > TENANT_MAX_CHARS:
        raise InvalidTenant(f"a tenant has at most {TENANT_MAX_CHARS} characters; this one has {len(tenant)}")
    if any(unicodedata.category(char) in {"Cc", "Cf", "Cs", "Zl", "Zp"} for char in tenant):
        raise InvalidTenant("a tenant may not hold control, format or line-separator characters")
    return tenant


def tenant_tag(tenant: str) -> str:
    """The tag a tenant's keys start with (empty for the default tenant)."""
    if validate_tenant(tenant) == DEFAULT_TENANT:
        return ""
    return "t" + hashlib.sha256(tenant.encode("utf-8")).hexdigest()[:_TAG_HEX_DIGITS]


def conversation_key(tenant: str, conversation_id: object) -> str:
    """The key of a tenant's conversation id (the id validated: :class:`InvalidConversationId`)."""
    tag = tenant_tag(tenant)
    plain = validate_conversation_id(conversation_id)
    return f"{tag}.{plain}" if tag else plain


def validate_conversation_key(key: object) -> str:
    """Return a conversation key (an id, or ``<tag>.<id>``) when it is well formed."""
    if isinstance(key, str) and "." in key:
        tag, _, plain = key.partition(".")
        if not _TAG_PATTERN.fullmatch(tag):
            raise InvalidConversationId(f"{key!r} is not a conversation key (a tenant's tag, '.', an id)")
        validate_conversation_id(plain)
        return key
    return validate_conversation_id(key)


def key_tag(key: str) -> str:
    """The tenant's tag of a key (empty: the default tenant)."""
    return key.partition(".")[0] if "." in key else ""


def key_id(key: str) -> str:
    """The id the tenant named (the key without its tenant's tag)."""
    return key.rpartition(".")[2]
