"""JupyterLab as ``kernelbridge lab`` starts it, and the server extension that keeps it current.

:func:`run_lab` starts jupyterlab's own ``LabApp`` with this package's managers, bound to 127.0.0.1
only (given last, it wins over any Jupyter config file), jupyter_server's token authentication as it
is (``JUPYTER_TOKEN``, or one printed in the URL), terminals off, and a directory of its own below
the namespace's state directory (``lab/``). The extension refreshes the kernels from the session
store every :data:`REFRESH_SECONDS`. Design: docs/design/server.md.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REFRESH_SECONDS = 1.0
"""How often the lab reads the session store: a session the agent starts is a kernel within this
(JupyterLab's Running panel polls the server every few seconds on top)."""
CONSOLE_PLUGIN = "@jupyterlab/console-extension:tracker"
OVERRIDES: dict[str, dict[str, Any]] = {
    CONSOLE_PLUGIN: {"showAllKernelActivity": True},
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}
"""The defaults the lab changes: a console shows every cell its kernel runs, not just its own; and
the page asks no one on the internet for news or updates (nor the person whether it may)."""


@dataclass(frozen=True, slots=True)
class LabOptions:
    """What ``kernelbridge lab`` was asked for."""

    state_dir: Path
    """The bridge's state directory (``KERNELBRIDGE_STATE_DIR``)."""
    namespace: str
    """``""``: the user's own sessions (stdio's); else an HTTP token's."""
    journal_limit: int
    port: int | None = None
    open_browser: bool = True
    allow_root: bool = False


def lab_dir(options: LabOptions) -> Path:
    """The lab's own files (made 0700 if missing): below the namespace's state directory."""
    from kernelbridge.config import namespace_state_dir

    root = namespace_state_dir(options.state_dir, options.namespace) / "lab"
    for part in ("", "config/jupyter_server_config.d", "settings", "workspaces", "kernelspec", "root"):
        (root / part).mkdir(parents=True, exist_ok=True, mode=0o700)
    return root


def write_overrides(settings_dir: Path, installed: Path) -> Path:
    """``overrides.json`` in ``settings_dir``: the installation's (``installed``, if any) with
    :data:`OVERRIDES` on top. Returns its path."""
    merged: dict[str, Any] = {}
    try:
        found = json.loads((installed / "overrides.json").read_text())
        merged = found if isinstance(found, dict) else {}
    except (OSError, ValueError):
        pass
    for plugin, values in OVERRIDES.items():
        current = merged.get(plugin)
        merged[plugin] = {**current, **values} if isinstance(current, dict) else dict(values)
    path = settings_dir / "overrides.json"
    path.write_text(json.dumps(merged, indent=2))
    return path


def lab_argv(options: LabOptions, directory: Path) -> list[str]:
    """LabApp's command line (see the module docstring)."""
    classes = {
        "kernel_manager_class": "kernelbridge.lab.kernels.SessionKernels",
        "kernel_spec_manager_class": "kernelbridge.lab.kernels.SessionSpecs",
        "contents_manager_class": "kernelbridge.lab.contents.SessionNotebooks",
        "kernel_websocket_connection_class": "kernelbridge.lab.channels.SessionChannels",
    }
    argv = [f"--ServerApp.{name}={value}" for name, value in classes.items()]
    for manager in ("SessionKernels", "SessionNotebooks"):
        argv += [f"--{manager}.state_dir={options.state_dir}", f"--{manager}.namespace={options.namespace}"]
    argv += [
        f"--SessionNotebooks.journal_limit={options.journal_limit}",
        "--SessionKernels.default_kernel_name=kernelbridge",
        f"--SessionSpecs.resources={directory / 'kernelspec'}",
        f"--ServerApp.root_dir={directory / 'root'}",
        f"--LabApp.app_settings_dir={directory / 'settings'}",
        f"--LabApp.workspaces_dir={directory / 'workspaces'}",
        "--ServerApp.terminals_enabled=False",
        f"--ServerApp.open_browser={options.open_browser}",
        f"--ServerApp.allow_root={options.allow_root}",
    ]
    if options.port is not None:
        argv += [f"--ServerApp.port={options.port}", "--ServerApp.port_retries=0"]
    # Last: loopback only, whatever a config file says.
    return [*argv, "--ServerApp.ip=127.0.0.1", "--ServerApp.allow_remote_access=False"]


def run_lab(options: LabOptions) -> None:
    """Run JupyterLab on the namespace's sessions until it is stopped (Ctrl-C, SIGTERM)."""
    from jupyterlab.commands import get_app_dir
    from jupyterlab.labapp import LabApp

    directory = lab_dir(options)
    write_overrides(directory / "settings", Path(get_app_dir()) / "settings")
    config = directory / "config"
    enable = {"ServerApp": {"jpserver_extensions": {__name__: True}}}
    (config / "jupyter_server_config.d" / "kernelbridge-lab.json").write_text(json.dumps(enable))
    # Jupyter's own way to enable an extension: a config directory on JUPYTER_CONFIG_PATH.
    os.environ["JUPYTER_CONFIG_PATH"] = os.pathsep.join(
        p for p in (str(config), os.environ.get("JUPYTER_CONFIG_PATH", "")) if p
    )
    LabApp.launch_instance(argv=lab_argv(options, directory))


# -- the server extension ----------------------------------------------------------------------------
def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": __name__}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from tornado.ioloop import PeriodicCallback

    from kernelbridge.lab.kernels import SessionKernels

    kernels = serverapp.kernel_manager
    if not isinstance(kernels, SessionKernels):
        serverapp.log.warning(
            "kernelbridge lab: the kernel manager is not kernelbridge's; no sessions are listed"
        )
        return
    serverapp.io_loop.add_callback(kernels.refresh)
    refresh = PeriodicCallback(kernels.refresh, REFRESH_SECONDS * 1000)
    refresh.start()
    where = f"HTTP token {kernels.namespace!r}" if kernels.namespace else "your own (stdio)"
    serverapp.log.info("kernelbridge lab: the live sessions of %s in %s", where, kernels.state_dir)
