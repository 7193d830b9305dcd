"""What a `kernelbridge` process (serve, export, replay, lab, ...) never imports: the grammar that
jsonschema would build as nbformat or jupyter-events import it."""

from __future__ import annotations

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
import kernelbridge.server, nbformat, jupyter_events.validators
nbformat.validate(nbformat.v4.new_notebook())
print(sorted(name for name in sys.modules if name.startswith("rfc3987_syntax.")))
"""


def test_the_command_line_does_without_the_iri_grammar_jsonschema_would_import() -> None:
    try:
        import rfc3987_syntax  # noqa: F401
    except ImportError:
        pytest.skip("rfc3987_syntax is not installed here: nothing to keep out")
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.splitlines()[-1] == "[]", probe.stdout
