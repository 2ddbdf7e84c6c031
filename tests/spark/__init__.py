"""Tests of the Spark data source (``ledgerq.spark``); they need pyspark, pyarrow and Java."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

__all__ = ["require_spark", "why_no_spark"]


def why_no_spark() -> str | None:
    """Why the Spark tests cannot run here, or None when they can."""
    missing = [m for m in ("pyspark", "pyarrow") if importlib.util.find_spec(m) is None]
    if missing:
        return (
            f"the Spark tests need {' and '.join(missing)}: install the spark extra "
            "(pip install -e '.[dev,spark]')"
        )
    if shutil.which("java") is None:
        return "the Spark tests need Java 17 or 21 on PATH (java was not found)"
    return None


def require_spark() -> None:
    """Skip the calling test module, with the reason, when Spark cannot run here."""
    reason = why_no_spark()
    if reason is not None:
        pytest.skip(reason, allow_module_level=True)
