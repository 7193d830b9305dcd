"""Code loaded INTO the sandbox's ipykernel process (named in the agent's argv,
``kernelbridge/inside/agent/kernel_process.py``):

``kernel_class.py``      ``--IPKernelApp.kernel_class``: IPythonKernel with protocol-exact history replies
``shell.py``             the kernel class's shell: the sandbox API's exceptions shown at the user's line
``capped_outstream.py``  ``--IPKernelApp.outstream_class``: stdout/stderr in bounded messages, capped per cell
``bounded_history.py``   ``--IPKernelApp.extensions``: IPython keeps no outputs and bounded inputs
``pip_magic.py``         ``--IPKernelApp.extensions``: ``%pip`` through the host, packages on sys.path
"""

HOST_CELL = "kernelbridge_host_cell"
"""Metadata key (true) of an execute_request the bridge's own client sent: the host ends such a
cell at its reply *and* iopub's idle, so the kernel answers it without ipykernel's pause before
the reply (``kernel_class.py``). The host imports it from here (this module imports nothing)."""
