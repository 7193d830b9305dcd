"""How tests wait: they bound every wait against a hang and never assert how long something took
(timing is bench/'s; tests/unit/test_structure.py finds such asserts)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import pytest


@contextmanager
def hang_guard(seconds: float, what: str) -> Iterator[None]:
    """Fail the test when ``what`` has not finished within ``seconds``: a bound against a hang, far
    above the time the right behaviour takes (where the wrong one would wait, make it wait longer
    than this), never a measure of speed."""
    try:
        with anyio.fail_after(seconds):
            yield
    except TimeoutError:
        pytest.fail(f"{what}: not finished within {seconds:g} s", pytrace=False)
