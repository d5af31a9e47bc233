"""Reading a policy: a built-in one by name, or a TOML file by path."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from sandbox_runtime.errors import PolicyError
from sandbox_runtime.policy.document import Policy, policy_from_mapping

__all__ = ["BUILTIN_POLICY_NAMES", "load_policy"]

BUILTIN_POLICY_NAMES = ("default", "strict", "gvisor", "podman")
_POLICY_DIR = Path(__file__).resolve().parent.parent / "_data" / "policies"


def load_policy(name_or_path: str | os.PathLike[str] = "default") -> Policy:
    """Load a built-in policy by name (``default``, ``strict``, ``gvisor``) or a TOML file by path."""
    text: str
    if isinstance(name_or_path, str) and name_or_path in BUILTIN_POLICY_NAMES:
        source = f"'{name_or_path}'"
        text = (_POLICY_DIR / f"{name_or_path}.toml").read_text(encoding="utf-8")
    else:
        path = Path(name_or_path)
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyError(f"cannot read policy {source}: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"invalid policy {source}: not TOML: {exc}") from exc
    return policy_from_mapping(data, source)
