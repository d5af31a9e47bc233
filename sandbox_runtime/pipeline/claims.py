"""A call id runs once: the host's call ids are claimed before they run (:mod:`~sandbox_runtime.state.claims`).

A call whose id another runtime (a replica) or another thread of this one is running waits for that run's
decision and answers with it, replayed like any stored decision; it never runs itself, unless the other run ended
without a decision (an infrastructure failure) or its runtime died, when it claims the id and runs it. The wait is
bounded by the policy's ``state.call_wait_s`` (then :class:`~sandbox_runtime.errors.CallStillRunning`) and ends
when the waiting call is cancelled. Calls made by a script need no claim of their own: their ids are their run's
call id and a number, and only the runtime holding that run's claim makes them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import CallStillRunning, InvalidToolArguments
from sandbox_runtime.models import StoredResult
from sandbox_runtime.state.database import StateDB

__all__ = ["CallClaimer", "check_call_id"]

_PAUSE_MAX_S = 0.2  # between two looks at a call another runtime runs
_CALL_ID_MAX_CHARS = 200


def check_call_id(call_id: str | None) -> str:
    """A host's call id, checked (:class:`InvalidToolArguments` for one that is empty, too long or has a NUL)."""
    if not call_id or len(call_id) > _CALL_ID_MAX_CHARS or "\x00" in call_id:
        raise InvalidToolArguments(f"a call id must be 1 to {_CALL_ID_MAX_CHARS} characters without NUL")
    return call_id


class CallClaimer:
    """Claims the call ids of one runtime (its lease), waiting for the ones others run (see the module text)."""

    def __init__(self, state: StateDB, lease_id: str, wait_s: float) -> None:
        self._state = state
        self._lease_id = lease_id
        self._wait_s = wait_s

    def claim(
        self,
        conversation_id: str,
        call_ids: Iterable[str],
        stored: dict[str, StoredResult],
        control: CallControl | None = None,
    ) -> list[str]:
        """Claim each call id that ``stored`` has no decision for; a decision stored meanwhile (while this waited
        for another run, or just before the claim) is added to ``stored`` instead. Returns the claims' tokens,
        to be given back (:meth:`give_back`) once the decisions are stored."""
        call_ids = [check_call_id(call_id) for call_id in call_ids]
        tokens: list[str] = []
        try:
            for call_id in call_ids:
                if call_id not in stored:
                    token = self._claim_one(conversation_id, call_id, stored, control)
                    if token is not None:
                        tokens.append(token)
        except BaseException:
            self.give_back(conversation_id, tokens)
            raise
        return tokens

    def give_back(self, conversation_id: str, tokens: list[str]) -> None:
        self._state.claims.give_back(conversation_id, tokens)

    def _claim_one(
        self, conversation_id: str, call_id: str, stored: dict[str, StoredResult], control: CallControl | None
    ) -> str | None:
        """The claim's token; None when the call was decided (``stored`` has its decision now)."""
        deadline = time.monotonic() + self._wait_s
        pause = 0.005
        while True:
            token = self._state.claims.take(conversation_id, call_id, self._lease_id)
            decided = self._state.stored_results(conversation_id, [call_id])  # after the claim: never missed
            if decided:
                self.give_back(conversation_id, [token] if token else [])
                stored.update(decided)
                return None
            if token is not None:
                return token
            if control is not None and control.cancelled.is_set():
                raise CallStillRunning(f"call id {call_id!r} runs elsewhere; the wait for its decision was cancelled")
            if time.monotonic() >= deadline:
                raise CallStillRunning(
                    f"call id {call_id!r} is running in another runtime or thread of conversation "
                    f"{conversation_id!r} and was not decided within {self._wait_s:g} s (state.call_wait_s); ask "
                    "again with the same call id later: its decision, once stored, is the answer"
                )
            time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))  # a bounded look again: nothing to wake
            pause = min(pause * 2, _PAUSE_MAX_S)
