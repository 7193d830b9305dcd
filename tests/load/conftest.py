"""Fixtures of the load tests: a real bridge over stdio per test (its memory is measured)."""

from __future__ import annotations

import pytest
from bridge_harness import ensure_image


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def sandbox_image() -> str:
    return ensure_image()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="a long soak: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
