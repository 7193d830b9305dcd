"""The load tests: a real bridge over stdio per test (its memory is measured); soaks only with --soak."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="a long soak: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
