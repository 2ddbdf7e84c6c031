"""Fixtures of the shared-mode tests: a small real disk (tmpfs) to fill up."""

from __future__ import annotations

from tests.realfs import small_disk

__all__ = ["small_disk"]
