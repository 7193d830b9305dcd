"""A session's record as notebooks: the journal, its notebook, and export.

- :mod:`~kernelbridge.notebook.journal`: the append-only journal of one session generation (its
  byte budget), its typed entries, bounded and untrusted reading;
- :mod:`~kernelbridge.notebook.convert`: journal entries <-> nbformat v4, notebook files read as
  untrusted input;
- :mod:`~kernelbridge.notebook.export`: notebooks written one cell at a time, in a worker process
  (exports, the notebook and outputs resources, restores);
(Replaying a notebook runs sessions: it is :mod:`kernelbridge.replay`, a client of the session
layer like the server.)

It knows no kernels and no MCP; where a session's journal lives is the session store's business.
"""
