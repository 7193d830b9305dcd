"""The notes the server adds to a result, beside the session's (:mod:`kernelbridge.session.outcome`).

Values, like the session's: :mod:`kernelbridge.server.render` is where they become sentences.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from kernelbridge.session.outcome import Note

if TYPE_CHECKING:
    from kernelbridge.replay.judge import ReplayReport


class ServerNoteCode(enum.StrEnum):
    """The machine-readable kind of a server's note (``structuredContent.note_codes``)."""

    RESTORED = "restored"
    FILES_PLACED = "files_placed"
    LIMITS_NOT_ENFORCED = "limits_not_enforced"
    IMAGES_NOT_SENT = "images_not_sent"
    IMAGE_NOT_DOWNSCALED = "image_not_downscaled"
    IMAGE_DOWNSCALED = "image_downscaled"


@dataclass(frozen=True, slots=True)
class Restored(Note):
    """The session was rebuilt from a notebook first (``run_python(restore=...)``)."""

    code: ClassVar[str] = ServerNoteCode.RESTORED
    session: str
    report: ReplayReport


@dataclass(frozen=True, slots=True)
class FilesPlaced(Note):
    """``run_python(files=...)`` wrote these files (path, bytes) into /workspace."""

    code: ClassVar[str] = ServerNoteCode.FILES_PLACED
    files: tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class LimitsNotEnforced(Note):
    """The runtime ignores memory and process limits and the operator allowed it (said on a
    session's first cell)."""

    code: ClassVar[str] = ServerNoteCode.LIMITS_NOT_ENFORCED


@dataclass(frozen=True, slots=True)
class ImagesNotSent(Note):
    """More distinct images than a result sends."""

    code: ClassVar[str] = ServerNoteCode.IMAGES_NOT_SENT
    count: int
    limit: int


@dataclass(frozen=True, slots=True)
class ImageNotDownscaled(Note):
    """Image ``number`` is over the budget and could not be made smaller: only its link is sent."""

    code: ClassVar[str] = ServerNoteCode.IMAGE_NOT_DOWNSCALED
    number: int
    kib: int
    budget: int
    uri: str


@dataclass(frozen=True, slots=True)
class ImageDownscaled(Note):
    """Image ``number`` was sent smaller, with a link to its full-size original."""

    code: ClassVar[str] = ServerNoteCode.IMAGE_DOWNSCALED
    number: int
    kib: int
    original: tuple[int, int]
    size: tuple[int, int]
    uri: str


ServerNote = Restored | FilesPlaced | LimitsNotEnforced | ImagesNotSent | ImageNotDownscaled | ImageDownscaled
"""Every note the server makes."""
