"""What the model is told names the policy's values: the tools' descriptions, their arguments' descriptions and the
server's instructions say where the results folder is and from what length a result is spilled, as the policy
says, never as the default says."""

from __future__ import annotations

import json

from sandbox_runtime.mcp.server import instructions
from sandbox_runtime.policy import Policy, policy_from_mapping
from sandbox_runtime.tools.builtin import builtin_tools

DEFAULT_RESULTS = "/mnt/results"


def _texts(policy: Policy) -> dict[str, str]:
    """Every text the model reads of the built-in tools: each description and each arguments schema."""
    texts = {f"{name} description": spec.description for name, spec in builtin_tools(policy).items()}
    texts |= {f"{name} schema": json.dumps(spec.input_schema()) for name, spec in builtin_tools(policy).items()}
    texts["instructions"] = instructions(policy)
    return texts


def _with(**changes: object) -> Policy:
    return policy_from_mapping({"sql": {"database_path": "/data/shop.db"}, **changes})


def test_the_default_policy_names_the_default_results_folder_and_threshold() -> None:
    texts = _texts(_with())
    assert "Results over 1,000 characters" in texts["run_python description"]
    assert "Results over 1,000 characters" in texts["sql_query description"]
    assert "over 1,000 characters is saved to a file in /mnt/results " in texts["instructions"]
    assert "/mnt/results/scripts/report.py" in texts["run_python schema"]


def test_another_spill_threshold_changes_every_text_that_names_it() -> None:
    texts = _texts(_with(spill={"threshold_chars": 4000}))
    assert "Results over 4,000 characters" in texts["run_python description"]
    assert "Results over 4,000 characters" in texts["sql_query description"]
    assert "over 4,000 characters is saved" in texts["instructions"]
    assert not [name for name, text in texts.items() if "1,000 characters" in text]


def test_a_tools_own_spill_threshold_is_the_one_its_description_names() -> None:
    texts = _texts(_with(spill={"tools": {"sql_query": {"threshold_chars": 250}}}))
    assert "Results over 250 characters" in texts["sql_query description"]
    assert "Results over 1,000 characters" in texts["run_python description"]


def test_another_results_folder_changes_every_text_that_names_it() -> None:
    texts = _texts(_with(sandbox={"results_mount_path": "/data/out"}))
    assert "results folder (/data/out)" in texts["run_python description"]
    assert "/data/out/exports/" in texts["export_table description"]
    assert "/data/out/args/create.json" in texts["delegate_call description"]
    assert "/data/out/scripts/report.py" in texts["run_python schema"]
    assert "/data/out/exports/report.docx" in texts["attach_file schema"]
    assert "saved to a file in /data/out " in texts["instructions"]
    assert not [name for name, text in texts.items() if DEFAULT_RESULTS in text]


def test_the_limits_a_description_names_are_the_policys() -> None:
    texts = _texts(_with(tools={"read_max_chars": 20_000, "render_rows_max": 50}, spill={"retention_s": 3 * 86400}))
    assert "at most 20,000 characters" in texts["read_file description"]
    assert "at most 50 rows are rendered" in texts["render_table description"]
    assert "after the 3-day cleanup" in texts["attach_file description"]
