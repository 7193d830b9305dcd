"""``kernelbridge lab``: JupyterLab on the agent's live sessions (issue 22).

jupyter_server and JupyterLab as they are, with their kernel manager, contents manager and kernel
websocket filled in here. The lab is a Jupyter client of the sessions' tunnels, like ``kernelbridge
attach``: it reads the session store (:mod:`.listing`), never writes it, and never owns a session's
kernel. Design: docs/design/server.md.
"""
