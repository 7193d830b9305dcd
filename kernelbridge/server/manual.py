"""The capabilities manual: what a model reads from ``kernelbridge://capabilities``."""

from __future__ import annotations

CAPABILITIES = """\
# kernelbridge sandbox

`run_python` runs code in a persistent IPython kernel inside a locked-down container.

- State persists per `session` (default "default"): variables, imports, functions and files
  in /workspace (writable, 256 MB) and /tmp. Sessions are isolated from each other.
- Top-level `await` works. The last expression's value is returned, like a notebook cell.
- No network. Calling host MCP servers (`servers=[...]`) is not available yet.
- Limits: memory (512 MB by default), CPU, processes. `input()` is not available.
- `timeout` (seconds) interrupts the cell; if it does not stop, the kernel restarts and the
  result says `state: lost`. Output is truncated (head and tail kept) past a limit.
- `IPython.display.display(Image(...))` / matplotlib figures come back as images.
- Tools: list_sessions, close_session (frees the sandbox), export_notebook (.ipynb of a session).
- Each session is also a notebook resource: kernelbridge://sessions/{session}/notebook
- Files in: `run_python(files={"data.csv": "a,b\\n1,2"})` places files in /workspace before the
  code runs (code may then be empty); a value starting with `base64:` is binary.
- Files out (while the session lives): kernelbridge://sessions/{session}/files (listing),
  .../files/{path} (text), .../blobs/{path} (binary).
- `run_python(restore="kernelbridge://sessions/{old}/notebook")` (or a .ipynb name in the
  exports directory) rebuilds a new session by re-running that notebook's cells; the result
  reports each cell as same / different / error / skipped.
- Large images arrive downscaled, with a resource link to the full-size original.
"""
