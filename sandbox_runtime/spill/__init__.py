"""The spill pipeline (issue 3): results over the threshold go to files the model addresses by path.

So far: :mod:`~sandbox_runtime.spill.spiller` (one result: threshold, descriptor, MCP unwrapping, preview and
inline cap, a failed write that never fails the call) and :mod:`~sandbox_runtime.spill.tables` (table
recognition and the typed table file). Not yet wired into the tools or the API.
"""
