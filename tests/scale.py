"""How many times the suite's repetitive tests repeat: fewer by default, all with ``--soak``.

Some tests repeat one behaviour many times over (hypothesis examples, kernels started at once,
calls per session), and past a few the count is endurance, not another check. The default run
repeats them fewer times, through the same code and the same assertions; ``pytest --soak`` runs
them at their full count (and the soak-marked tests of ``tests/load`` too). ``tests/conftest.py``
sets ``SOAK`` in ``pytest_configure``, which runs in every process (each xdist worker too) before
any test module is imported, so a module may use it at import time::

    from scale import soak_or

    CALLS = soak_or(30, 100)

    @settings(max_examples=soak_or(500, 1500), deadline=None)
    @given(...)

Not for a count the check depends on (a burst past a cap, output past a limit): keep those fixed.
"""

from __future__ import annotations

SOAK = False
"""Whether this run is a soak (``--soak``): set by ``tests/conftest.py``'s ``pytest_configure``."""


def soak_or(default: int, soak: int) -> int:
    """``soak`` under ``--soak``, else ``default``."""
    return soak if SOAK else default
