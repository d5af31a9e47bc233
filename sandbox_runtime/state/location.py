"""Where a runtime's state lives: the SQLite file in its state directory (the default), or the PostgreSQL server
a URL names (several replicas share one).

The URL comes from, first to last: the one given to the runtime, ``$SANDBOX_RUNTIME_STATE_URL``, the policy's
``state.url``. A policy file is often committed, so a URL in it may not carry a password (libpq's
``$PGPASSWORD`` or ``~/.pgpass`` give it, or the environment variable's URL); a password is never logged or
shown. Whatever the store, the conversations' folders stay files in the state directory, which every replica
mounts (the same disk on one host; a read-write-many volume on a cluster).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from sandbox_runtime.errors import PolicyError, StateUnavailable
from sandbox_runtime.policy import StatePolicy
from sandbox_runtime.state.engine import StateEngine
from sandbox_runtime.state.sqlite import SqliteEngine

__all__ = [
    "STATE_FILE",
    "STATE_URL_FILE",
    "STATE_URL_VARIABLE",
    "mark_state_dir",
    "open_engine",
    "state_dir_in_use",
    "state_url",
]

STATE_URL_VARIABLE = "SANDBOX_RUNTIME_STATE_URL"
STATE_FILE = "state.sqlite3"  # the embedded store, in the state directory
STATE_URL_FILE = "state.url"  # a state directory whose store is a server names it here (without its password)
_POSTGRES_SCHEMES = ("postgresql", "postgres")


def state_url(given: str | None, policy: StatePolicy, environment: Mapping[str, str] | None = None) -> str | None:
    """The state's URL (None: the SQLite file in the state directory), checked; :class:`PolicyError` for one
    that names no store this runtime keeps."""
    env = os.environ if environment is None else environment
    url = given or env.get(STATE_URL_VARIABLE) or policy.url
    if not url:
        return None
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        return None
    if scheme not in _POSTGRES_SCHEMES:
        raise PolicyError(
            f"the state URL must start with postgresql:// (or be empty: the SQLite file in the state directory); "
            f"got one starting {url.split(':', 1)[0][:20]!r}:"
        )
    return url


def open_engine(state_dir: Path, url: str | None, policy: StatePolicy, *, mark: bool = True) -> StateEngine:
    """The engine of the state at ``url`` (None: ``STATE_DIR/state.sqlite3``); a server's is named in the state
    directory (``mark``: now; else :func:`mark_state_dir` once it is the directory's state)."""
    marker = state_dir / STATE_URL_FILE
    if url is None:
        if marker.is_file():
            raise StateUnavailable(
                f"the state of {state_dir} lives on {marker.read_text(encoding='utf-8').strip()} (named in {marker}): "
                f"give its URL (${STATE_URL_VARIABLE} or the policy's state.url), or remove {marker.name} to start "
                "an empty SQLite state in that directory"
            )
        return SqliteEngine(state_dir / STATE_FILE)
    try:
        from sandbox_runtime.state.postgresql import PostgresEngine  # noqa: PLC0415  (psycopg only when it is used)
    except ImportError as exc:
        raise PolicyError(
            f"a PostgreSQL state store needs psycopg: pip install 'sandbox-runtime[postgresql]' ({exc})"
        ) from exc
    engine = PostgresEngine(url, connections_max=policy.connections_max, connect_timeout_s=policy.connect_timeout_s)
    try:
        if mark:
            mark_state_dir(state_dir, engine)
    except BaseException:
        engine.close()
        raise
    return engine


def mark_state_dir(state_dir: Path, engine: StateEngine) -> None:
    """Name the server the state directory's state lives on (``state.url``, without its password)."""
    marker = state_dir / STATE_URL_FILE
    if not marker.is_file() or marker.read_text(encoding="utf-8").strip() != engine.shown:
        marker.write_text(engine.shown + "\n", encoding="utf-8")


def state_dir_in_use(state_dir: Path) -> bool:
    """Whether a state directory still has a store: its SQLite file, or the file naming its server. (A sandbox
    whose state directory has neither is an orphan.)"""
    return (state_dir / STATE_FILE).exists() or (state_dir / STATE_URL_FILE).exists()
