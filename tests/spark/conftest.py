"""One local Spark session for every test of this folder, and the guards around it.

The session (``local[2]``, UI off, bound to 127.0.0.1, time zone UTC) starts once, at
the first test that asks for it, and stops at the end of the run: starting a JVM costs
5-9 s.  Nothing here imports pyspark at import time, so the folder is skipped (with
the reason) rather than broken where pyspark or Java is missing.

Before the JVM starts, its environment is set for the Python workers it launches (it
keeps a copy; this process's environment is restored right after): the interpreter
running pytest (not whatever ``python3`` is on PATH), and the repository root on
``PYTHONPATH`` - which is where an installed ledgerq would put the ``pyspark_ledgerq``
module that PySpark finds by listing the path (an editable install hides it behind an
import hook that such a listing does not see).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark import why_no_spark
from tests.spark.helpers import build_tree

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# Deprecation warnings raised *inside* PySpark's or py4j's own modules are theirs, not
# ours, and a newer Python may start raising them: they are let through for this folder
# only (none were raised with Python 3.11 and PySpark 4.3.0).  pytest's
# filterwarnings=error still applies to everything else, and ResourceWarning - an open
# file or socket of ours - is never silenced.
_KNOWN_WARNINGS = (
    "ignore::DeprecationWarning:py4j.*",
    "ignore::DeprecationWarning:pyspark.*",
    "ignore::FutureWarning:pyspark.*",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            for spec in _KNOWN_WARNINGS:
                item.add_marker(pytest.mark.filterwarnings(spec))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The shared SparkSession, with the ``ledgerq`` format registered."""
    reason = why_no_spark()
    if reason is not None:
        pytest.skip(reason)
    from pyspark.sql import SparkSession

    from ledgerq.spark import register

    saved = dict(os.environ)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), path) if p)
    work = tmp_path_factory.mktemp("spark")
    java_options = (
        "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 "
        f"-Dlog4j2.configurationFile=file:{HERE / 'log4j2-test.properties'} "
        f"-Dderby.system.home={work}"
    )
    session = (
        SparkSession.builder.master("local[2]")
        .appName("ledgerq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.warehouse.dir", str(work / "warehouse"))
        .config("spark.local.dir", str(work / "local"))
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.driver.extraJavaOptions", java_options)
        .getOrCreate()
    )
    os.environ.clear()
    os.environ.update(saved)
    _JVM_READER.append(register(session))
    yield session
    session.stop()


_JVM_READER: list[bool] = []  # whether register() gave the session the JVM reader
READERS = ("jvm", "python")


@pytest.fixture
def reader(spark: Any) -> Iterator[str]:
    """Run a read test on the reader users get: the JVM one where javac is, else Python.

    The Python reader is held to the JVM one entry by entry in test_jvm.py and to the
    format spec in tests/format; running every read test on both doubled the Spark
    share of ``make test`` past CI's budget.
    """
    from ledgerq.spark import READER_CONF

    name = READERS[0] if _JVM_READER[-1] else READERS[1]
    spark.conf.set(READER_CONF, "true" if name == "jvm" else "false")
    yield name
    spark.conf.set(READER_CONF, "true")


@pytest.fixture(autouse=True)
def _stop_streams(request: pytest.FixtureRequest) -> Iterator[None]:
    """A failed streaming test must not leave a query running into the next one."""
    yield
    if "spark" in request.fixturenames:
        for query in request.getfixturevalue("spark").streams.active:
            query.stop()


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree of queues made by :func:`~tests.spark.helpers.build_tree`, one for each
    test module (one may change it): headers, priorities, TTLs and compression."""
    root = tmp_path_factory.mktemp("tree")
    build_tree(root)
    return root
