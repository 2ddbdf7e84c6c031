"""The JVM reader: its jar, built from the Java sources shipped in ``ledgerq/spark/jvm``.

Batch reads through PySpark's Python data source hand every row from a Python worker to
the JVM, which caps them near 0.66x of Parquet's rows/s whatever the worker does (see
docs/spark.md).  The Java classes in ``jvm/src`` are a Spark DataSource V2 provider,
``ledgerq.DefaultSource``, that Spark finds for ``format("ledgerq")`` before the
registered Python source: it is that Python source for everything (a subclass of
Spark's provider of Python sources), except that a batch read's planned segments are
read in the JVM.

The jar is compiled on first use with the JDK's ``javac`` against the jars PySpark
ships (no build tool, no network), into a cache directory named after a hash of the
sources and of the pyspark version, so an upgrade of either builds it again.  Without
``javac`` (a JRE only) there is no jar and reads stay on the Python reader.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "CACHE_ENV",
    "PROVIDER",
    "READER_CONF",
    "enable_jvm_reader",
    "jvm_classpath",
    "jvm_jar",
    "jvm_scan",
]

logger = logging.getLogger("ledgerq")

SOURCES = Path(__file__).resolve().parent / "jvm" / "src"
PROVIDER = "ledgerq.DefaultSource"
READER_CONF = "spark.ledgerq.jvmReader"  # "false": every read on the Python reader
CACHE_ENV = "LEDGERQ_JVM_CACHE"  # where the jar is built (default: ~/.cache/ledgerq/jvm)
_JAR_NAME = "ledgerq-spark-jvm.jar"


def _pyspark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def _sources() -> list[Path]:
    return sorted(SOURCES.rglob("*.java"))


def _cache_root() -> Path:
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ledgerq" / "jvm"


def _javac() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "javac"), os.X_OK):
        return os.path.join(home, "bin", "javac")
    return shutil.which("javac")


def _digest() -> str:
    import pyspark

    h = hashlib.sha256(pyspark.__version__.encode())
    for path in _sources():
        h.update(str(path.relative_to(SOURCES)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def jvm_jar() -> str | None:
    """The path of the JVM reader's jar, compiled first if needed; None without ``javac``.

    A failed compilation, or a cache directory that cannot be written, is logged (with
    javac's output) and also gives None: reads then use the Python reader.
    """
    try:
        return _build_jar()
    except OSError as exc:
        logger.warning(
            "ledgerq: the JVM reader's jar could not be built (%s); Spark reads use the "
            "Python reader (set %s to a writable directory)",
            exc,
            CACHE_ENV,
        )
        return None


def _build_jar() -> str | None:
    target = _cache_root() / _digest() / _JAR_NAME
    if target.exists():
        return str(target)
    javac = _javac()
    if javac is None:
        logger.info("ledgerq: no javac (a JDK) found; Spark reads use the Python reader")
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        classes = Path(work) / "classes"
        command = [
            javac,
            "-nowarn",
            "--release",
            "17",
            "-encoding",
            "UTF-8",
            "-d",
            str(classes),
            "-cp",
            str(_pyspark_jars() / "*"),
            *map(str, _sources()),
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            logger.warning(
                "ledgerq: the JVM reader did not compile; Spark reads use the Python reader "
                "(javac said: %s)",
                (done.stderr or done.stdout).strip()[-2000:],
            )
            return None
        staged = Path(work) / _JAR_NAME
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, str(path.relative_to(classes)))
        # Atomic: a session that starts meanwhile sees the whole jar or none.
        os.replace(staged, target)
    return str(target)


def jvm_classpath() -> list[str]:
    """What a ``java`` command needs to run the JVM reader outside Spark (tests, tools)."""
    jar = jvm_jar()
    if jar is None:
        return []
    return [jar, str(_pyspark_jars() / "*")]


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def jvm_scan(tasks: list[str]) -> list[dict[str, Any]] | None:
    """Run the JVM reader without Spark on ``tasks`` (``_plan.task_to_json`` texts).

    One ``java`` process for all of them (``ledgerq.jvm.Dump``); per task, a dict of
    ``rows`` (``[id, timestamp_us, expires_at_us, priority, headers, payload_hex,
    deliver_at_us]``) and the counts ``corrupt_regions``, ``corrupt_bytes`` and
    ``lost_messages``, or ``{"error": message}`` when the read failed.  None without
    a JDK.  For the tests that hold the JVM reader to the format and to the Python
    reader.
    """
    classpath = jvm_classpath()
    java = _java()
    if not classpath or java is None:
        return None
    done = subprocess.run(
        [java, "-cp", os.pathsep.join(classpath), "ledgerq.jvm.Dump"],
        input="".join(task + "\n" for task in tasks),
        capture_output=True,
        text=True,
        check=True,
    )
    # One JSON document a line; split on "\n" only: splitlines() also splits on the
    # U+0085 and U+2028 a header value may hold (Jackson writes them unescaped).
    return [json.loads(line) for line in done.stdout.split("\n") if line.strip()]


def _provider_visible(spark: SparkSession) -> bool:
    jvm: Any = spark.sparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    try:
        jvm.java.lang.Class.forName(PROVIDER, False, loader)
    except Exception:  # py4j wraps the ClassNotFoundException
        return False
    return True


def enable_jvm_reader(spark: SparkSession) -> bool:
    """Put the JVM reader on ``spark``'s classpath if it is not there; True when it is.

    A session started with the jar (``spark.jars``, see :func:`jvm_jar`) has it
    already.  Otherwise the jar is added to the running session (``ADD JAR``: the
    executors fetch it, and this thread's class loader sees it).
    """
    if _provider_visible(spark):
        return True
    jar = jvm_jar()
    if jar is None:
        return False
    spark.sql(f"ADD JAR '{jar}'")
    visible = _provider_visible(spark)
    if not visible:
        logger.warning("ledgerq: the JVM reader's jar was added but Spark cannot see it")
    return visible
