"""The security suite's ``bridge``: one real bridge per test module (see ``bridge_harness.module_bridge``)."""

from __future__ import annotations

from bridge_harness import module_bridge

bridge = module_bridge("security")
