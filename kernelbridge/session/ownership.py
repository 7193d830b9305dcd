"""Who holds a session: an ownership lock per session name, and the secret of a durable sandbox.

The lock is an exclusive ``flock`` held from creating or adopting the session until closing or
detaching it; the kernel drops it when the process ends (SIGKILL included), so a second bridge on
the state directory cannot :func:`claim` it. A secret file is mode 0600, created exclusively, never
followed through a symlink, and read only if it is a private regular file of this user
(:func:`read_secret`). Blocking file I/O (small files).

Design: docs/design/sessions.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import string
import time
from dataclasses import dataclass
from pathlib import Path

from kernelbridge import frames

CLAIM_ATTEMPTS = 10
CLAIM_RETRY = 0.02
"""A probe holds a lock for microseconds: ten tries 20 ms apart outlast one."""
SECRET_CHARS = 2 * frames.SECRET_BYTES
_HEX = frozenset(string.hexdigits.lower())


@dataclass(eq=False, slots=True)
class Claim:
    """A held ownership lock (released by :meth:`release`, or when this process ends)."""

    path: Path
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)  # closing the only descriptor drops the flock
            self.fd = -1

    @property
    def held(self) -> bool:
        return self.fd >= 0


def _open_lock(path: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o600)


def claim(path: Path, *, attempts: int = CLAIM_ATTEMPTS) -> Claim | None:
    """Take the lock at ``path`` (creating the file); None if another process holds it. Raises
    OSError when the file cannot be opened (the state directory is read-only, say)."""
    fd = _open_lock(path)
    for attempt in range(attempts):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return Claim(path, fd)
        except BlockingIOError:
            if attempt < attempts - 1:
                time.sleep(CLAIM_RETRY)
        except OSError:
            os.close(fd)
            raise
    os.close(fd)
    return None


def held_elsewhere(path: Path) -> bool:
    """Whether another process holds the lock at ``path`` now (a probe: taken and dropped at once;
    a file that is not there is held by nobody)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # also drops the lock if we got it
    return False


def write_secret(path: Path, secret: str) -> None:
    """Keep ``secret`` in a new private file at ``path``. Raises OSError (also when something is
    there already: a secret is never overwritten)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, secret.encode())
    finally:
        os.close(fd)


def read_secret(path: Path) -> str | None:
    """The secret kept at ``path``, or None when there is none that can be trusted: no file, a
    symlink, not a regular file, not this user's, readable by others, or not a secret."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            return None
        data = os.read(fd, SECRET_CHARS + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    secret = data.decode(errors="replace")
    if len(secret) != SECRET_CHARS or not set(secret) <= _HEX:
        return None
    return secret


def move_secret(source: Path, target: Path) -> bool:
    """Move a secret file (a warm sandbox's, to the session that takes it); False if it was not
    there. Never replaces a file at ``target``."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        return False
    with contextlib.suppress(OSError):
        source.unlink()
    return True
