"""Where the runtime's state lives and how it is reached (``[state]``)."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, field_validator

from sandbox_runtime.policy.base import PositiveFloat, PositiveInt, Section

__all__ = ["StatePolicy"]


class StatePolicy(Section):
    """Where the runtime's state (conversations, decisions, leases, tasks) lives, and how it is reached."""

    url: str | None = Field(
        None,
        description="A PostgreSQL server several replicas share (postgresql://user@host:port/database); none: the "
        "SQLite file in the state directory. $SANDBOX_RUNTIME_STATE_URL comes first. No password here (a policy "
        "file is often committed): $PGPASSWORD, ~/.pgpass or the environment variable's URL give it.",
    )
    connections_max: PositiveInt = Field(
        16, description="Most connections one runtime opens to a PostgreSQL state store at once."
    )
    connect_timeout_s: PositiveFloat = Field(
        5.0,
        description="The longest a state operation waits for a PostgreSQL connection before it fails with "
        "StateUnavailable (the server down or every connection busy).",
    )
    lease_ttl_s: PositiveFloat = Field(
        30.0,
        description="A runtime renews its lease every third of this; one on another host that did not renew it "
        "for this long counts as gone (its sandboxes may be taken over, its calls run again). A process of this "
        "host is checked by its pid at once.",
    )
    call_wait_s: PositiveFloat = Field(
        660.0,
        description="A call whose id is already running (in another thread or replica) waits this long at most "
        "for that run's decision, then fails; the decision, once stored, is its answer (never a second run).",
    )

    @field_validator("url")
    @classmethod
    def _no_password(cls, url: str | None) -> str | None:
        if url and urlsplit(url).password is not None:
            raise ValueError(
                "a state URL in a policy may not carry a password: give it by $PGPASSWORD or ~/.pgpass, or put "
                "the whole URL in $SANDBOX_RUNTIME_STATE_URL"
            )
        return url
