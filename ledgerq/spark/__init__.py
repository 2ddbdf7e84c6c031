"""Spark integration: the ``ledgerq`` data source for PySpark's Python Data Source API.

>>> from ledgerq.spark import foreach_batch_writer, register   # doctest: +SKIP
>>> register(spark)
>>> df = spark.read.format("ledgerq").load("/data/queues")
>>> stream.writeStream.foreachBatch(foreach_batch_writer("/data/work")).start()

Needs the ``spark`` extra (``pip install 'ledgerq[spark]'``: pyspark 4.3 and pyarrow) and
Java 17 or 21.  ``import ledgerq`` never imports pyspark; importing this module without
it raises ``ImportError`` saying what to install.  See ``docs/spark.md``.
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401
    import pyspark.sql.datasource  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        f"ledgerq.spark needs pyspark (>= 4.3) and pyarrow, which are not installed ({exc}); "
        "install them with: pip install 'ledgerq[spark]'"
    ) from exc

from typing import TYPE_CHECKING

from ledgerq.spark._foreach_batch import foreach_batch_writer
from ledgerq.spark._jvm import READER_CONF, enable_jvm_reader, jvm_jar
from ledgerq.spark._source import READ_SCHEMA, READ_SCHEMA_WITH_STATE, LedgerqDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "PUSHDOWN_CONF",
    "READER_CONF",
    "READ_SCHEMA",
    "READ_SCHEMA_WITH_STATE",
    "LedgerqDataSource",
    "foreach_batch_writer",
    "jvm_jar",
    "register",
]

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark: SparkSession, *, jvm_reader: bool = True) -> bool:
    """Register the ``ledgerq`` format with ``spark`` and turn on Python filter pushdown.

    Pushdown (off by default in Spark) lets reads skip segments by id, time and queue.
    With ``jvm_reader`` (the default), batch reads run in the JVM: the reader's jar is
    built on first use (it needs a JDK's ``javac``) and added to the session unless it
    was started with it (``spark.jars``: :func:`jvm_jar`).  Returns whether the JVM
    reader serves this session's batch reads; without it (no ``javac``, or
    ``jvm_reader=False``) they use the Python reader.  Sessions that find the statically
    registered source (the ``pyspark_ledgerq`` module) need no call, and use pushdown
    when the session enables it.
    """
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(LedgerqDataSource)
    if not jvm_reader:
        spark.conf.set(READER_CONF, "false")
        return False
    spark.conf.set(READER_CONF, "true")
    return enable_jvm_reader(spark)
