"""The spill pipeline (issue 3): results over the threshold go to files the model addresses by path.

So far: :mod:`~sandbox_runtime.spill.tables`, table recognition and the typed table file.
"""
