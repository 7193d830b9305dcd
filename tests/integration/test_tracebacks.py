"""Tracebacks for the model in a real sandbox: an error deep inside pandas comes back with the
user's line, the frame that raised and one line counting the library frames left out; the
notebook keeps the whole traceback."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = [pytest.mark.podman]

CODE = 'import pandas as pd\n\ndef load(name):\n    return pd.read_csv(name)\n\nframe = load("nope.csv")'


@pytest.mark.anyio
async def test_an_error_inside_pandas_costs_the_model_little(connect: Any) -> None:
    async with connect(KERNELBRIDGE_WARM_POOL="0") as client:
        result = await client.call_tool("run_python", {"code": CODE})
        notebook = await client.call_tool("export_notebook", {"session": "default"})
    text = result.content[0].text
    error = result.structured_content["error"]
    assert error["ename"] == "FileNotFoundError"
    for shown in (text, error["traceback"]):
        assert 'frame = load("nope.csv")' in shown and "return pd.read_csv(name)" in shown
        assert "library frames (pandas) left out; the full traceback is in the session's notebook" in shown
        assert shown.count("library frames") == 1
        assert "FileNotFoundError: [Errno 2] No such file or directory: 'nope.csv'" in shown
        # read_csv's long parameter list is not in it.
        assert "keep_default_na" not in shown
    assert len(error["traceback"]) < 2000, len(error["traceback"])
    cells = json.loads(notebook.content[0].text)["cells"]
    (output,) = [o for o in cells[-1]["outputs"] if o["output_type"] == "error"]
    full = "\n".join(output["traceback"])
    assert "keep_default_na" in full and len(full) > 2 * len(error["traceback"])
