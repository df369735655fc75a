"""python_export through the official MCP Python SDK: a branch written as a
Jupyter notebook validates with nbformat, runs headless with nbconvert to the
same outputs, and the script export runs with python to the same output.

The Jupyter tools live in their own venv (scripts/test-env.sh), named by
$FERREPL_NB_PYTHON; without it the tests fail (they never skip).
"""

import asyncio
import json
import os
import subprocess

import pytest
from mcp import StdioServerParameters

import conftest

pytestmark = pytest.mark.timeout(180)


def nb_python():
    path = os.environ.get("FERREPL_NB_PYTHON") or str(conftest.ROOT / "target" / "test-env" / "nb" / "bin" / "python")
    if not os.access(path, os.X_OK):
        pytest.fail(f"no Jupyter venv at {path}: run scripts/test-env.sh (or set FERREPL_NB_PYTHON)", pytrace=False)
    return os.path.abspath(path)


def run(coro):
    return asyncio.run(coro)


def outputs_of(cell):
    """What a code cell showed: its stream text and its value, comparable."""
    streams, values = [], []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            text = out["text"]
            streams.append(("".join(text) if isinstance(text, list) else text, out["name"]))
        elif out["output_type"] == "execute_result":
            data = out["data"]["text/plain"]
            values.append("".join(data) if isinstance(data, list) else data)
    return streams, values


def test_a_branch_exports_to_a_notebook_that_runs_and_a_script(ferrepl_bin, workdir, mode):
    params = StdioServerParameters(
        command=ferrepl_bin,
        args=["--workdir", str(workdir), "--tools", "all", *conftest.STRUCTURED],
        env=conftest.state_env(workdir),
    )

    async def session():
        async with conftest.connect(params, mode) as client:
            tools = await conftest.SchemaCheckedTools(client).load()

            async def exec_(code, **extra):
                return await tools.call("python_exec", {"code": code, "wait_s": 30, **extra})

            await exec_("import math\nrows = [1, 2, 3]")
            await exec_("print('sum', sum(rows))")
            failed = await exec_("1/0")
            assert failed.is_error
            await exec_("rows.append(4)\nlen(rows)")
            await exec_("{'floor': math.floor(2.5), 'rows': rows}")
            await exec_("rows.append(99)\nrows", parent=2)
            nb = await tools.call("python_export", {"path": "out/analysis.ipynb", "format": "ipynb", "cell": 5})
            assert not nb.is_error, nb
            assert nb.structured_content["cells"] == [1, 2, 4, 5], nb
            assert nb.structured_content["skipped"] == [3], nb
            py = await tools.call("python_export", {"path": "out/branch.py", "format": "py"})
            assert not py.is_error, py
            assert py.structured_content["cells"] == [1, 2, 6], py

    run(session())
    notebook = workdir / "out" / "analysis.ipynb"
    script = workdir / "out" / "branch.py"
    python = nb_python()
    check = subprocess.run(
        [python, "-c", "import nbformat, sys; nbformat.validate(nbformat.read(sys.argv[1], as_version=4))", str(notebook)],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    executed = workdir / "out" / "executed.ipynb"
    ran = subprocess.run(
        [python, "-m", "nbconvert", "--to", "notebook", "--execute", str(notebook), "--output", str(executed)],
        capture_output=True,
        text=True,
        env=dict(os.environ, JUPYTER_PATH=str(os.path.dirname(os.path.dirname(python)) + "/share/jupyter")),
    )
    assert ran.returncode == 0, ran.stderr
    exported = json.loads(notebook.read_text())
    again = json.loads(executed.read_text())
    assert [c["source"] for c in exported["cells"]] == [c["source"] for c in again["cells"]]
    assert [outputs_of(c) for c in exported["cells"]] == [outputs_of(c) for c in again["cells"]]
    assert outputs_of(exported["cells"][1]) == ([("sum 6\n", "stdout")], [])
    assert outputs_of(exported["cells"][2])[1] == ["4"]

    out = subprocess.run([python, str(script)], capture_output=True, text=True, cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "sum 6\n", out.stdout
    assert "# %% cell 6" in script.read_text()
