"""Typed tables: recognising them, their cells and file format, and reading and writing them within caps.

:mod:`~sandbox_runtime.tables.cells` types cells and columns; :mod:`~sandbox_runtime.tables.table` recognises
tables in tool results and holds the typed table file (``*.table.jsonl``); :mod:`~sandbox_runtime.tables.jsonio`
is the fast JSON both use. Reading a table file from the results folder: :mod:`~sandbox_runtime.tables.source`
(:func:`~sandbox_runtime.tables.source.open_table`, which picks the reader), :mod:`~sandbox_runtime.tables.lines`
(the caps and the bounded line reader), :mod:`~sandbox_runtime.tables.text_reader` (CSV, TSV, Markdown),
:mod:`~sandbox_runtime.tables.json_reader` (a whole-JSON table); :mod:`~sandbox_runtime.tables.sort` sorts rows
in bounded memory and :mod:`~sandbox_runtime.tables.writers` writes CSV and XLSX. The spill and the table tools
(``export_table``, ``render_table``) sit above this package; it imports only errors, policy and store.
"""
