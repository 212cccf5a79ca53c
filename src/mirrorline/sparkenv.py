"""The one place a SparkSession is made: local by default, quiet, with Python workers on this interpreter."""

from __future__ import annotations

import os
import sys
import time
from importlib import resources
from typing import TYPE_CHECKING

from mirrorline import scratch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[2]"
_started_seconds: float | None = None


def get_spark(master: str | None = None, app: str = "mirrorline", conf: dict[str, str] | None = None) -> SparkSession:
    """Get (or make) the process's SparkSession. ``$MIRRORLINE_SPARK_MASTER`` overrides the default ``local[2]``."""
    global _started_seconds
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    from pyspark.sql import SparkSession

    log4j = resources.files("mirrorline").joinpath("resources/log4j2.properties")
    java_opts = f"-Dlog4j.configurationFile=file:{log4j} -Dlog4j2.configurationFile=file:{log4j}"
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "4",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.driver.memory": os.environ.get("MIRRORLINE_SPARK_DRIVER_MEMORY", "4g"),
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.sql.warehouse.dir": os.path.join(os.environ.get("TMPDIR", "/tmp"), "mirrorline-spark-warehouse"),
        # shuffle and spill files in the process's scratch folder: removed after a crash too (mirrorline.scratch)
        "spark.local.dir": str(scratch.folder() / "spark"),
        **(conf or {}),
    }
    t0 = time.monotonic()
    builder = SparkSession.builder.master(master or os.environ.get("MIRRORLINE_SPARK_MASTER", DEFAULT_MASTER))
    builder = builder.appName(app)
    for k, v in settings.items():
        builder = builder.config(k, v)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    if _started_seconds is None:
        _started_seconds = time.monotonic() - t0
    return session


def startup_seconds() -> float | None:
    """How long the first ``get_spark`` call of this process took (Spark's start-up time)."""
    return _started_seconds
