"""An inspect ``eval`` of a small task whose scripted model (``mockllm``, offline) calls inspect's own ``bash()`` and
``python()`` tools, each run in the ``sandbox_runtime`` sandbox on Docker and on Podman: the login shell finds the
image's Python with its libraries, the working directory is the results folder, and the sample's conversation is
deleted after it. (Kept apart from the conformance suite's module: inspect runs its own event loop.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai import Task
from inspect_ai import eval as inspect_eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash, python
from inspect_ai.util import SandboxEnvironmentSpec

from sandbox_runtime.adapters.inspect_ai import SANDBOX_NAME
from sandbox_runtime.api.runtime import Runtime
from tests.test_adapter_inspect_ai import ENGINES, config_for

MODEL = "mockllm/model"
# inspect's own code, not ours: its retry helper passes tenacity a deprecated parameter, and it leaves anyio memory
# streams to the garbage collector
pytestmark = [
    pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning"),
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in.*MemoryObjectReceiveStream:pytest.PytestUnraisableExceptionWarning"
    ),
]


@pytest.mark.parametrize("policy", ENGINES)
def test_an_eval_whose_model_calls_bash_and_python_runs_them_in_the_sandbox(
    policy: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    request.getfixturevalue("executor_image" if policy == "default" else "podman_image")
    state_dir = tmp_path / "state"
    outputs = [
        ModelOutput.for_tool_call(model=MODEL, tool_name="bash", tool_arguments={"command": "pwd; whoami; id -u"}),
        ModelOutput.for_tool_call(
            model=MODEL,
            tool_name="python",
            tool_arguments={"code": "import openpyxl, sys; print(sys.executable); print(6 * 7)"},
        ),
        ModelOutput.from_content(model=MODEL, content="the answer is 42"),
    ]
    for output in outputs:  # offline: mockllm would otherwise count tokens with a downloaded encoding
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    task = Task(
        dataset=[Sample(input="work it out", target="42")],
        solver=[use_tools([bash(timeout=60), python(timeout=60)]), generate()],
        scorer=includes(),
        sandbox=SandboxEnvironmentSpec(SANDBOX_NAME, config_for(policy, state_dir)),
    )
    (log,) = inspect_eval(
        task, model=get_model(MODEL, custom_outputs=outputs), display="none", log_dir=str(tmp_path / "logs")
    )
    assert log.status == "success", log.error
    assert log.samples is not None
    tools = [m for m in log.samples[0].messages if m.role == "tool"]
    assert [m.error for m in tools] == [None, None]
    assert tools[0].text.split() == ["/mnt/results", "sandbox", "10001"]
    assert tools[1].text.split() == ["/opt/venv/bin/python3", "42"]
    with Runtime(state_dir, policy, reap_interval_s=None, retention_interval_s=None) as runtime:
        assert runtime.state.conversations() == []  # the sample's conversation was deleted after it
