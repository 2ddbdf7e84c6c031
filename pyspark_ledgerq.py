"""Static registration of the ``ledgerq`` Spark data source.

PySpark imports every top-level module named ``pyspark_*`` it finds on the Python path
at the first data-source call of a session and registers its ``DefaultSource``, so
``spark.read.format("ledgerq")`` works without calling ``ledgerq.spark.register``
(filter pushdown is then used when the session enables
``spark.sql.python.filterPushdown.enabled``).
"""

from __future__ import annotations

from ledgerq.spark import LedgerqDataSource as DefaultSource

__all__ = ["DefaultSource"]
