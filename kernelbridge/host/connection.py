"""Connection files: where a Jupyter client finds a sandbox's tunnel (ports and the host key)."""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any


def new_connection(ip: str = "127.0.0.1") -> dict[str, Any]:
    """Connection info with port 0 everywhere (bound to free ports by the tunnel) and a fresh key."""
    return {
        "transport": "tcp",
        "ip": ip,
        "shell_port": 0,
        "iopub_port": 0,
        "stdin_port": 0,
        "control_port": 0,
        "hb_port": 0,
        "key": secrets.token_hex(32),
        "signature_scheme": "hmac-sha256",
        "kernel_name": "kernelbridge",
    }


def write_connection_file(path: Path, connection: dict[str, Any]) -> None:
    """Write ``connection`` (mode 0600, in a 0700 directory) atomically: it holds the host key."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(connection, f, indent=1)
    os.replace(tmp, path)
