"""``kernelbridge lab``: JupyterLab on the agent's live sessions (issue 22).

jupyter_server and JupyterLab as they are, with four of their extension points filled in:

- :mod:`.kernels`: the kernel manager (``ServerApp.kernel_manager_class``) whose kernels are the
  live sessions of one namespace, each connected through its tunnel's connection file and never
  owned: starting, shutting down or restarting one from the page is refused with one line (the
  session belongs to the agent); an interrupt is passed on. The kernelspec manager lists the one
  ``kernelbridge`` spec the sessions' kernels and notebooks name.
- :mod:`.contents`: the contents manager: ``<session>.ipynb``, each session's journal exported
  when it is opened, read-only.
- :mod:`.channels`: the kernel websocket connection: a cell typed in the page carries the
  person's user name (journalled ``source: client`` as ``kernelbridge attach``'s are), and one
  sent to a session that ended meanwhile is answered with one line saying so.
- :mod:`.app`: the command line ``LabApp`` is started with (loopback only, jupyter_server's token,
  console settings that show every cell of the kernel) and the server extension that keeps the
  list of sessions current.

What is listed is read from the session store (:mod:`.listing`), never written: the lab is a
Jupyter client of the sessions' tunnels, like ``kernelbridge attach``.
"""
