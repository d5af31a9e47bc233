"""The one dispatch pipeline every call goes through: a ``delegate_call`` expanded, arguments validated, approval
(:mod:`.approval`), the run and its execution record (:mod:`.call`), the spill and the turn budget, and the
decision stored before anything is returned (:mod:`.dispatch`); turns of calls that arrive one
by one share one budget (:mod:`.turns`)."""
