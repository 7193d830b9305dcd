"""What a `kernelbridge` process (serve, export, replay, lab, ...) never imports: what a library
would import when it is installed and no kernelbridge process uses (``kernelbridge.lazy``)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

PROBE = """
import sys
from kernelbridge.cli import main
try:
    main(["--version"])  # every command starts as this one does
except SystemExit:
    pass
{imports}
print(sorted(name for name in sys.modules if name.split(".")[0] == {module!r} and sys.modules[name]))
"""

CASES = {
    # jsonschema would build its iri grammar as nbformat and jupyter-events import it.
    "rfc3987_syntax": (
        "rfc3987-syntax",
        "import kernelbridge.server, nbformat, jupyter_events.validators\n"
        "nbformat.validate(nbformat.v4.new_notebook())",
    ),
    # httpcore2 would import trio to tell whether it runs under it; the engine API still works.
    "trio": ("trio", "import anyio, httpcore2, kernelbridge.runtime.engine.transport"),
}


@pytest.mark.parametrize("module", sorted(CASES))
def test_the_command_line_does_without_what_no_process_of_it_uses(module: str) -> None:
    distribution, imports = CASES[module]
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{distribution} is not installed here: nothing to keep out")
    probe = PROBE.format(imports=imports, module=module)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]", done.stdout
