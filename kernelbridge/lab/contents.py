"""The lab's files (``ServerApp.contents_manager_class``): one read-only notebook per session.

The top directory lists ``<session>.ipynb`` for each session of the namespace that has a journal,
live or not; opening one exports the journal's current generation then (in a worker process, as
the bridge's exports are: :mod:`kernelbridge.notebook.export`), so it shows the history up to that
moment (JupyterLab's "Reload Notebook from Disk" reads it again). Nothing can be written: saving,
renaming, deleting, new files and checkpoints are refused with one line. The agent's outputs are
shown untrusted (JupyterLab sanitizes their HTML and runs none of their scripts): they come from a
sandbox.
"""

from __future__ import annotations

import datetime
import hashlib
from functools import partial
from pathlib import Path
from typing import Any

import anyio.to_process
import nbformat
from jupyter_server.services.contents.manager import AsyncContentsManager
from tornado import web
from traitlets import Int, Unicode

from kernelbridge.lab.listing import NOTEBOOK_SUFFIX, journalled_sessions, session_of_notebook
from kernelbridge.notebook.export import NotebookTooLarge, notebook_text, run_niced
from kernelbridge.session.store import SessionStore

READ_ONLY = (
    "kernelbridge lab's notebooks are the sessions' journals, read-only: "
    "`kernelbridge export NAME -o FILE.ipynb` writes a copy you can edit"
)


class SessionNotebooks(AsyncContentsManager):
    """The sessions' notebooks (see the module docstring)."""

    state_dir = Unicode(help="the namespace's state directory (kernelbridge lab sets it)").tag(config=True)
    namespace = Unicode("", help="the HTTP token's namespace; empty: the user's own").tag(config=True)
    journal_limit = Int(1 << 30, help="bytes of a journal read at most (KERNELBRIDGE_JOURNAL_BUDGET)").tag(
        config=True
    )

    @property
    def store(self) -> SessionStore:
        return SessionStore.of_namespace(Path(self.state_dir), self.namespace)

    async def dir_exists(self, path: str) -> bool:
        return path.strip("/") == ""

    async def is_hidden(self, path: str) -> bool:
        return False

    async def file_exists(self, path: str) -> bool:
        return self._journal(path) is not None

    async def exists(self, path: str) -> bool:
        return await self.dir_exists(path) or await self.file_exists(path)

    async def get(
        self,
        path: str,
        content: bool = True,
        type: str | None = None,
        format: str | None = None,
        require_hash: bool = False,
    ) -> dict[str, Any]:
        if await self.dir_exists(path):
            if type not in (None, "directory"):
                raise web.HTTPError(400, f"{path!r} is the directory of the sessions' notebooks")
            return self._directory(content)
        journal = self._journal(path)
        if journal is None:
            raise web.HTTPError(
                404, f"no notebook {path!r}: kernelbridge lab shows NAME{NOTEBOOK_SUFFIX} for each session"
            )
        if type not in (None, "notebook"):
            raise web.HTTPError(400, f"{path!r} is a notebook")
        model = _model(path.strip("/"), journal)
        if content or require_hash:
            text = await self._notebook_text(path, journal)
            if content:
                model["content"], model["format"] = nbformat.reads(text, as_version=4), "json"
            if require_hash:  # of what is shown: the notebook as exported now
                model["hash"], model["hash_algorithm"] = hashlib.sha256(text.encode()).hexdigest(), "sha256"
        return model

    def _journal(self, path: str) -> Path | None:
        session = session_of_notebook(path)
        return None if session is None else self.store.journal_or_none(session)

    def _directory(self, content: bool) -> dict[str, Any]:
        model = _model("", Path(self.state_dir), kind="directory")
        if content:
            store = self.store
            listed = []
            for session in journalled_sessions(store):
                journal = store.journal_or_none(session)
                if journal is not None:
                    listed.append(_model(session + NOTEBOOK_SUFFIX, journal))
            model["content"], model["format"] = listed, "json"
        return model

    async def _notebook_text(self, path: str, journal: Path) -> str:
        session = session_of_notebook(path) or ""
        work = partial(notebook_text, journal, session, max_bytes=self.journal_limit)
        try:
            text: str = await anyio.to_process.run_sync(run_niced, work)
        except NotebookTooLarge as exc:
            raise web.HTTPError(413, str(exc)) from None
        except OSError as exc:
            raise web.HTTPError(404, f"the journal of session {session!r} cannot be read ({exc})") from None
        return text

    # -- nothing is written ----------------------------------------------------------------------
    async def save(self, model: dict[str, Any], path: str) -> dict[str, Any]:
        raise web.HTTPError(403, READ_ONLY)

    async def delete_file(self, path: str) -> None:
        raise web.HTTPError(403, READ_ONLY)

    async def rename_file(self, old_path: str, new_path: str) -> None:
        raise web.HTTPError(403, READ_ONLY)

    async def new(self, model: dict[str, Any] | None = None, path: str = "") -> dict[str, Any]:
        raise web.HTTPError(403, READ_ONLY)

    async def new_untitled(self, path: str = "", type: str = "", ext: str = "") -> dict[str, Any]:
        raise web.HTTPError(403, READ_ONLY)

    async def copy(self, from_path: str, to_path: str | None = None) -> dict[str, Any]:
        raise web.HTTPError(403, READ_ONLY)

    async def create_checkpoint(self, path: str) -> dict[str, Any]:
        raise web.HTTPError(403, READ_ONLY)

    async def restore_checkpoint(self, checkpoint_id: str, path: str) -> None:
        raise web.HTTPError(403, READ_ONLY)

    async def list_checkpoints(self, path: str) -> list[dict[str, Any]]:
        return []

    async def delete_checkpoint(self, checkpoint_id: str, path: str) -> None:
        raise web.HTTPError(403, READ_ONLY)


def _model(path: str, source: Path, kind: str = "notebook") -> dict[str, Any]:
    try:
        info = source.stat()
        modified, size = datetime.datetime.fromtimestamp(info.st_mtime, datetime.UTC), info.st_size
    except OSError:
        modified, size = datetime.datetime.fromtimestamp(0, datetime.UTC), None
    return {
        "name": path.rsplit("/", 1)[-1],
        "path": path,
        "type": kind,
        "writable": False,
        "created": modified,
        "last_modified": modified,
        "size": size if kind == "notebook" else None,
        "mimetype": None,
        "content": None,
        "format": None,
    }
