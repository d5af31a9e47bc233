"""Which runtime runs a call id now: the ``call_claims`` table of the state database.

A call the host names by its id runs at most once per conversation, even when the same id reaches two runtimes
(replicas behind a load balancer, two threads of one process) at the same moment: before it runs, the call id
is claimed (one row: the claim's own token, the lease of the runtime that holds it). The claim is given back once
the call's decision is stored (or it failed without one); a claim whose runtime is gone (its lease counts as
gone, see :mod:`~sandbox_runtime.state.leases`) is taken over by the next runtime that asks. No claim outlives
the attempt that made it while its runtime lives: a give-back the state refused (it was away), and the claim of a
``take`` that failed (its insert may have been made all the same), are owed (:mod:`~sandbox_runtime.state.owed`)
and given back once the state answers, first thing in the runtime's next ``take``.
"""

from __future__ import annotations

import time
import uuid

from sandbox_runtime.state.engine import StateEngine
from sandbox_runtime.state.leases import Leases
from sandbox_runtime.state.owed import OwedWrites

__all__ = ["CallClaims"]

_TRIES = 3  # a claim given back between the insert and the look at its holder: try again (a few times at most)


class CallClaims:
    """The claims of one state database."""

    def __init__(self, engine: StateEngine, leases: Leases, owed: OwedWrites) -> None:
        self._engine = engine
        self._leases = leases
        self._owed = owed

    def take(self, conversation_id: str, call_id: str, lease_id: str) -> str | None:
        """Claim the call id for a run by ``lease_id``: the claim's token, or None while another claim holds it (of a
        live runtime, or of another thread of this one). The claims this runtime owes the state go back first."""
        self._owed.settle()
        token = uuid.uuid4().hex
        return self._owed.make(
            f"claim {token}",
            lambda: self._take(conversation_id, call_id, lease_id, token),
            undo=lambda: self._delete(conversation_id, [token]),
        )

    def _take(self, conversation_id: str, call_id: str, lease_id: str, token: str) -> str | None:
        for _ in range(_TRIES):
            with self._engine.transaction(durable=False) as db:  # a crash ends its lease: the claim with it
                if db.run(
                    "INSERT INTO call_claims(conversation_id, call_id, claim, lease_id, claimed_at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT(conversation_id, call_id) DO NOTHING",
                    (conversation_id, call_id, token, lease_id, time.time()),
                ):
                    return token
                holder = db.row(
                    "SELECT claim, lease_id FROM call_claims WHERE conversation_id = ? AND call_id = ?",
                    (conversation_id, call_id),
                )
            if holder is None:
                continue  # given back just now
            if holder["lease_id"] == lease_id or holder["lease_id"] in {lease.id for lease in self._leases.live()}:
                return None
            with self._engine.statements() as db:  # its runtime is gone: the claim is taken over
                if db.run(
                    "UPDATE call_claims SET claim = ?, lease_id = ?, claimed_at = ? "
                    "WHERE conversation_id = ? AND call_id = ? AND claim = ?",
                    (token, lease_id, time.time(), conversation_id, call_id, holder["claim"]),
                ):
                    return token
        return None

    def give_back(self, conversation_id: str, tokens: list[str]) -> None:
        """Give claims back (each only if it is still this claim: one taken over stays with its new holder)."""
        if tokens:
            self._owed.make(f"give back {' '.join(tokens)}", lambda: self._delete(conversation_id, tokens))

    def _delete(self, conversation_id: str, tokens: list[str]) -> None:
        with self._engine.transaction(durable=False) as db:
            for token in tokens:
                db.run("DELETE FROM call_claims WHERE conversation_id = ? AND claim = ?", (conversation_id, token))
