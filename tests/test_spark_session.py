"""The harness's SparkSession: local, on this interpreter, Python workers usable."""

from __future__ import annotations

import sys

import pytest

pytestmark = pytest.mark.spark


def test_session_is_local_with_two_cores(spark):
    assert spark.sparkContext.master == "local[2]"


def test_python_workers_run_this_interpreter(spark):
    rdd = spark.sparkContext.parallelize([0, 1], 2)
    assert set(rdd.map(lambda _: __import__("sys").executable).collect()) == {sys.executable}
