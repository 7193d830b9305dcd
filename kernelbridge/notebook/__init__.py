"""A session's record as notebooks: the journal, its notebook, export and replay.

- :mod:`~kernelbridge.notebook.journal`: the append-only journal of one session generation (its
  byte budget), its typed entries, bounded and untrusted reading;
- :mod:`~kernelbridge.notebook.convert`: journal entries <-> nbformat v4, notebook files read as
  untrusted input;
- :mod:`~kernelbridge.notebook.export`: notebooks written one cell at a time, in a worker process
  (exports, the notebook and outputs resources, restores);
- :mod:`~kernelbridge.notebook.replay`: a notebook's cells through a session registry, judged
  against the original (imported on its own: it runs sessions, which journal through this package).

It knows no kernels and no MCP; where a session's journal lives is the session store's business.
"""
