"""A bridge's start-up imports run without Python's cyclic garbage collector, and what they made is
frozen after (``kernelbridge.lazy.uncollected``): the collector is back as it was, whatever happens."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from kernelbridge.lazy import uncollected


@pytest.fixture(autouse=True)
def collector_as_it_was() -> Iterator[None]:
    """This worker's objects go back to being collected after each test (frozen ones never are)."""
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()


def test_an_import_runs_without_the_collector_and_what_it_made_is_frozen() -> None:
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with uncollected():
        assert not gc.isenabled()
        made = [[index] for index in range(1000)]  # containers: objects the collector tracks
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(made)
    assert all(gc.is_tracked(item) for item in made)


def test_a_failed_import_gives_the_collector_back() -> None:
    with pytest.raises(ModuleNotFoundError), uncollected():
        import kernelbridge_no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert gc.isenabled()


def test_a_collector_switched_off_before_stays_off() -> None:
    gc.disable()
    with uncollected():
        pass
    assert not gc.isenabled()
