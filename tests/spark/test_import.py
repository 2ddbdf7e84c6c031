"""pyspark stays optional: ``import ledgerq`` never loads it, ``ledgerq.spark`` says what is
missing.  Plus the pieces of the source that need no Spark session."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest

from tests.spark import why_no_spark

_BLOCK_PYSPARK = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ImportError(f"No module named {name!r}")
sys.meta_path.insert(0, Block())
"""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_import_ledgerq_does_not_import_pyspark() -> None:
    result = _python(
        "import sys, ledgerq, ledgerq.aio\n"
        "assert 'pyspark' not in sys.modules and 'pyarrow' not in sys.modules, "
        "sorted(m for m in sys.modules if m.startswith(('pyspark', 'pyarrow')))"
    )
    assert result.returncode == 0, result.stderr


def test_ledgerq_spark_without_pyspark_says_what_to_install() -> None:
    result = _python(_BLOCK_PYSPARK + "import ledgerq.spark\n")
    assert result.returncode != 0
    assert "pip install 'ledgerq[spark]'" in result.stderr
    assert "ImportError" in result.stderr


@pytest.fixture
def spark_modules() -> None:
    reason = why_no_spark()
    if reason is not None and "Java" not in reason:
        pytest.skip(reason)


@pytest.mark.usefixtures("spark_modules")
def test_arrow_schema_is_what_pyspark_expects() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    from ledgerq.spark import READ_SCHEMA, READ_SCHEMA_WITH_STATE
    from ledgerq.spark._scan import ARROW_SCHEMA, ARROW_SCHEMA_WITH_STATE

    assert to_arrow_schema(READ_SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)
    assert to_arrow_schema(READ_SCHEMA_WITH_STATE, timezone="UTC").equals(ARROW_SCHEMA_WITH_STATE)


@pytest.mark.usefixtures("spark_modules")
def test_filters_fold_into_inclusive_bounds() -> None:
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        LessThan,
        StringStartsWith,
    )

    from ledgerq.spark._plan import Pushed
    from ledgerq.spark._source import _push

    pushed = Pushed()
    t = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert _push(pushed, GreaterThan(("id",), 10))
    assert _push(pushed, LessThan(("id",), 100))
    assert _push(pushed, In(("id",), (5, 20, 30)))
    assert _push(pushed, GreaterThanOrEqual(("timestamp",), t))
    assert _push(pushed, EqualTo(("queue",), "a"))
    assert not _push(pushed, StringStartsWith(("queue",), "a"))
    assert not _push(pushed, EqualTo(("payload",), b"x"))
    assert not _push(pushed, GreaterThan(("id",), 2.5))
    assert (pushed.id_lo, pushed.id_hi, pushed.ids) == (11, 99, frozenset({5, 20, 30}))
    assert pushed.ts_lo == int(t.timestamp()) * 1_000_000 + 678901
    assert pushed.queues == frozenset({"a"})
    assert not pushed.is_empty
    assert _push(pushed, EqualTo(("queue",), "b"))
    assert pushed.is_empty


@pytest.mark.usefixtures("spark_modules")
def test_admission_shares_the_limit_between_queues() -> None:
    from ledgerq.spark._source import _admit

    assert _admit({"a": 0, "b": 0}, {"a": 100, "b": 5}, 30) == {"a": 25, "b": 5}
    assert _admit({"a": 10}, {"a": 12, "b": 50}, 30) == {"a": 12, "b": 28}
    assert _admit({}, {"a": 3}, 30) == {"a": 3}


@pytest.mark.usefixtures("spark_modules")
def test_read_options_are_checked() -> None:
    from ledgerq import ConfigError
    from ledgerq.spark._source import read_options

    parsed = read_options({"path": "/q", "include_dlq": "TRUE", "mode": "failfast"})
    assert parsed.paths == ("/q",) and parsed.include_dlq and parsed.failfast
    for bad in (
        {},
        {"path": "/q", "arrow": "maybe"},
        {"path": "/q", "maxRecordsPerTrigger": "0"},
        {"path": "/q", "startingOffsets": '{"q": -1}'},
    ):
        with pytest.raises(ConfigError):
            read_options(bad)


def test_the_public_names_of_ledgerq_spark_are_pinned() -> None:
    if why_no_spark() is not None:
        pytest.skip(why_no_spark())
    import ledgerq.spark

    assert ledgerq.spark.__all__ == [
        "PUSHDOWN_CONF",
        "READER_CONF",
        "READ_SCHEMA",
        "READ_SCHEMA_WITH_STATE",
        "LedgerqDataSource",
        "foreach_batch_writer",
        "jvm_jar",
        "register",
    ]
    for name in ledgerq.spark.__all__:
        assert getattr(ledgerq.spark, name) is not None, name
    assert ledgerq.spark.foreach_batch_writer.__doc__
