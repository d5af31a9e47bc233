"""Spill: a tool result over the threshold goes to a file in the results folder, and the model gets its path.

:mod:`~sandbox_runtime.spill.spiller` decides for one result (threshold, descriptor, MCP unwrapping, preview and
inline cap; a failed write never fails the call) and writes a recognised table as a typed line file (the format
of :mod:`~sandbox_runtime.tables.table`); :mod:`~sandbox_runtime.spill.shown` makes one call's result what the
model is shown (its body spilled or whole, its error shortened, its notes); :mod:`~sandbox_runtime.spill.budget` is
the per-turn budget;
:mod:`~sandbox_runtime.spill.history` keeps replacements so a rebuilt history is byte-identical;
:mod:`~sandbox_runtime.spill.retention` removes old spill files.
"""
