"""The one place a SparkSession is made: local by default, quiet, with Python workers on this interpreter."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mirrorline import scratch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from mirrorline.config import SparkConfig

DEFAULT_MASTER = f"local[{os.cpu_count() or 2}]"  # the machine's cores
_started_seconds: float | None = None
_configured: SparkConfig | None = None

# The driver's JVM maps, when ``./dev setup`` made one, a class-data-sharing archive of the classes a unit loads
# (Spark starts in about half the time: class loading is most of a cold start). A missing or stale archive is
# ignored, silently. (C1-only JIT, -XX:TieredStopAtLevel=1, started small units 1-2 s sooner but made 1M-change
# units 30-80 % slower in bench/apply: not used.)


def class_archive() -> Path:
    """Where the class-data-sharing archive of this PySpark and this Java lives (one per pair)."""
    import pyspark

    java = shutil.which("java") or "java"
    key = hashlib.sha256(f"{pyspark.__version__}|{os.path.realpath(java)}|{sys.executable}".encode()).hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "mirrorline" / f"spark-{pyspark.__version__}-{key[:12]}.jsa"


def _archive_opts() -> str:
    if os.environ.get("MIRRORLINE_CLASS_ARCHIVE_BUILD"):
        return f"-XX:ArchiveClassesAtExit={os.environ['MIRRORLINE_CLASS_ARCHIVE_BUILD']}"
    path = class_archive()
    if path.is_file():
        return f"-XX:SharedArchiveFile={path} -Xlog:cds=off -Xlog:cds+dynamic=off"
    return ""


def _owner(archive: Path) -> Path:
    """The file naming the interpreter an archive was built for (its key is a hash of that path)."""
    return archive.with_name(archive.name + ".python")


def prune_class_archives(folder: Path) -> list[Path]:
    """Remove the archives whose interpreter no longer exists: each is built for one environment (it records the
    paths of that environment's jars), so every new virtual environment, every fresh clone, adds one of about 160 MB.
    An archive whose interpreter is not recorded (made before this was) is kept. Returns the archives removed."""
    removed = []
    for owner in folder.glob("spark-*.jsa.python"):
        archive = owner.with_name(owner.name.removesuffix(".python"))
        try:
            python = owner.read_text().strip()
        except OSError:
            continue
        if python and not os.path.exists(python):
            archive.unlink(missing_ok=True)
            owner.unlink(missing_ok=True)
            removed.append(archive)
    return removed


def _record_and_prune(archive: Path) -> str:
    """Record the archive's interpreter and remove the archives of environments that are gone: housekeeping, so a
    failure only says so (the archive itself is made and used either way)."""
    try:
        _owner(archive).write_text(sys.executable)
        pruned = prune_class_archives(archive.parent)
    except OSError as e:
        return f" (old archives not pruned: {e})"
    return f" (removed {len(pruned)} of environments that are gone)" if pruned else ""


def build_class_archive() -> tuple[Path | None, str]:
    """Make the class-data-sharing archive (``./dev setup`` runs this once): a JVM that compiles the warm-up's
    units writes the classes it loaded when it exits; the archive appears under its final name only once complete.
    Returns the archive (None when it could not be made) and what happened, in words."""
    import subprocess

    final = class_archive()
    if final.is_file():
        return final, f"class archive: {final}"
    tmp = final.with_name(f".{final.name}.{os.getpid()}")
    env = {**os.environ, "MIRRORLINE_CLASS_ARCHIVE_BUILD": str(tmp)}
    code = (
        "from mirrorline.sparkenv import get_spark; from mirrorline.compile.warmup import warm_small; "
        "warm_small(get_spark())"
    )
    why = "the JVM wrote no archive"
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        if done.returncode == 0 and tmp.is_file() and tmp.stat().st_size > 0:
            os.replace(tmp, final)
            return final, f"class archive: {final}{_record_and_prune(final)}"
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    except (OSError, subprocess.TimeoutExpired) as e:
        why = str(e)
    tmp.unlink(missing_ok=True)
    return (
        None,
        f"class archive not built ({why}); Spark starts without one, slower (set XDG_CACHE_HOME to a "
        "writable folder and run ./dev setup again)",
    )


def configure(cfg: SparkConfig) -> None:
    """The configuration's ``[spark]`` section, for the session this process makes (call before the first
    :func:`get_spark`; a session already made is kept as it is)."""
    global _configured
    _configured = cfg
    scratch.configure(cfg.scratch)


def master() -> str:
    """The master the session is (or will be) made with: the configuration's, else ``$MIRRORLINE_SPARK_MASTER``,
    else local with the machine's cores."""
    if _configured is not None and _configured.master:
        return _configured.master
    return os.environ.get("MIRRORLINE_SPARK_MASTER", DEFAULT_MASTER)


# Sized for a small machine (bench/live reports run's peak memory): a heap of at most 1 GB (local mode: the executors
# are in this JVM) that starts small, grows with the work and gives back what it no longer uses. While Spark works,
# the serial collector keeps 40-70% of the heap free (HotSpot's defaults): 10-30% leaves the old generation little
# above its live data, a full collection every 0.3-0.7 s (bench/compile --sizes 10000000 with -Xlog:gc: 11-15 s of
# 46-52 s, against 3 s of 41-43 s with 40-70%). When run is idle it asks for one collection with the tight
# ratios (:func:`shrink`), which gives back at once (not over several collections) all but 30% of free heap.
# Raise with [spark] conf = { "spark.driver.memory" = "4g" } (or MIRRORLINE_SPARK_DRIVER_MEMORY) for units of
# millions of changes on a machine that has the memory.
DRIVER_MEMORY = "1g"
WORK_FREE = (40, 70)  # MinHeapFreeRatio, MaxHeapFreeRatio (percent) while Spark works
IDLE_FREE = (10, 30)  # the same for shrink's collection
SMALL_JVM = (
    f"-Xms64m -XX:+UseSerialGC -XX:MinHeapFreeRatio={WORK_FREE[0]} -XX:MaxHeapFreeRatio={WORK_FREE[1]} "
    "-XX:-ShrinkHeapInSteps"
)
SHRINK_GROWTH = 32 << 20  # a heap grown by more than this since the last shrink is worth a collection (shrink)
_shrunk_to = 64 << 20  # the heap's size after the last shrink (at first: -Xms)


def get_spark(
    master_url: str | None = None, app: str = "mirrorline", conf: dict[str, str] | None = None
) -> SparkSession:
    """Get (or make) the process's SparkSession: the master given, else :func:`master`; ``[spark] conf`` over
    mirrorline's settings, ``conf`` over both."""
    global _started_seconds
    cfg = _configured
    if cfg is not None and cfg.python:
        os.environ["PYSPARK_PYTHON"] = cfg.python
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")
    from pyspark.sql import SparkSession

    log4j = resources.files("mirrorline").joinpath("resources/log4j2.properties")
    java_opts = f"-Dlog4j.configurationFile=file:{log4j} -Dlog4j2.configurationFile=file:{log4j}"
    driver_opts = f"{java_opts} {SMALL_JVM} {_archive_opts()}".strip()
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.default.parallelism": "4",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        # Spark's Python workers: one idle worker kept between jobs, not one per core, each holding about 100 MB of
        # its own (pyarrow, pandas, imported after its fork); the small route's job is one task, and a job of
        # parallel Python tasks (a warm-up, worktables loaded by Spark tasks, a snapshot's chunks) starts the others
        # it needs. SQL's Python tasks run with this variable set, an RDD's (a snapshot's) without: set for both,
        # they share one daemon and its workers where they would keep two (bench/bigtxn --tables wide: peak_pss_mb)
        "spark.python.factory.idleWorkerMaxPoolSize": "1",
        "spark.executorEnv.SPARK_SIMPLIFIED_TRACEBACK": "1",
        # jobs of a pool share the cores fairly with other pools: a target loading beside live targets (run) has a
        # pool of its own, so that their small units do not queue behind its chunks
        "spark.scheduler.mode": "FAIR",
        "spark.driver.memory": os.environ.get("MIRRORLINE_SPARK_DRIVER_MEMORY", DRIVER_MEMORY),
        "spark.driver.extraJavaOptions": driver_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.sql.warehouse.dir": os.path.join(os.environ.get("TMPDIR", "/tmp"), "mirrorline-spark-warehouse"),
        "spark.pyspark.python": os.environ["PYSPARK_PYTHON"],
        **(cfg.conf if cfg is not None else {}),
        **(conf or {}),
    }
    url = master_url or master()
    if url.startswith("local"):  # shuffle and spill files in the process's scratch folder: removed after a crash
        settings.setdefault("spark.local.dir", str(scratch.folder() / "spark"))  # too (mirrorline.scratch)
    t0 = time.monotonic()
    builder = SparkSession.builder.master(url)
    builder = builder.appName(app)
    for k, v in settings.items():
        builder = builder.config(k, v)
    _launch_quietly(url, app, settings)
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    sigint = signal.getsignal(signal.SIGINT) if main else None
    session = builder.getOrCreate()
    if main and signal.getsignal(signal.SIGINT) is not sigint:  # PySpark's own cancels every job, then raises:
        signal.signal(signal.SIGINT, sigint)  # the command's own handling of Ctrl-C stays in force
    session.sparkContext.setLogLevel("ERROR")
    if _started_seconds is None:
        _started_seconds = time.monotonic() - t0
    return session


JVM_BANNER = b"WARNING: Using incubator modules"  # Spark's launcher always adds --add-modules=jdk.incubator.vector
_muted: list[bool] = []  # set once the command is interrupted: the JVM's complaints about it are not relayed


def mute_jvm() -> None:
    """Relay nothing more the JVM writes to stderr (the command was interrupted: what the JVM says about the calls
    cut short is noise)."""
    _muted.append(True)


def _launch_quietly(url: str, app: str, settings: dict[str, str]) -> None:
    """Start Spark's JVM (the py4j gateway) as :meth:`SparkSession.Builder.getOrCreate` would, with the same
    settings, but with its stderr passed on line by line to this process's (file descriptor 2, as before) without the
    banner every JVM prints when Spark's launcher adds an incubator module. Nothing when the JVM runs already."""
    import signal
    import subprocess
    import threading

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    interrupted: list[bool] = []
    main = threading.current_thread() is threading.main_thread()
    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return
        conf = SparkConf().setMaster(url).setAppName(app).setAll(list(settings.items()))
        # Ctrl-C while the JVM starts waits until it is up: interrupted earlier, the JVM would find the folder it
        # writes its port to removed, and live on with nothing to stop it
        previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True)) if main else None
        try:
            gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)
        SparkContext._gateway = gateway
        SparkContext._jvm = gateway.jvm
    err = gateway.proc.stderr

    def relay() -> None:
        for line in iter(err.readline, b""):
            if not _muted and not line.startswith(JVM_BANNER):
                try:
                    os.write(2, line)
                except OSError:
                    return

    threading.Thread(target=relay, name="mirrorline-jvm-stderr", daemon=True).start()
    if interrupted:
        raise KeyboardInterrupt


def shrink() -> int:
    """When this process has a JVM whose heap grew by more than :data:`SHRINK_GROWTH` since the last call, collect
    it with the idle ratios (:data:`IDLE_FREE`): the serial collector then gives what is unused beyond 30% of the heap
    back to the system (a heap grown by a warm-up or a large unit otherwise stays grown, mostly garbage, until the old
    generation fills; bench/bigtxn's peak memory shows what it holds), and the working ratios (:data:`WORK_FREE`) are
    set again. Returns the bytes given back. For idle moments: a full collection pauses Spark's jobs briefly."""
    global _shrunk_to
    from pyspark import SparkContext

    jvm = SparkContext._jvm if started() else None
    if jvm is None:
        return 0
    runtime = jvm.java.lang.Runtime.getRuntime()
    before = int(runtime.totalMemory())
    if before <= _shrunk_to + SHRINK_GROWTH:
        return 0
    bean = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    _free_ratios(bean, IDLE_FREE)  # (both flags are "manageable": set while the JVM runs)
    try:
        jvm.java.lang.System.gc()
    finally:
        _free_ratios(bean, WORK_FREE)
    _shrunk_to = int(runtime.totalMemory())
    return max(0, before - _shrunk_to)


def _free_ratios(bean: Any, ratios: tuple[int, int]) -> None:
    """Set the JVM's MinHeapFreeRatio and MaxHeapFreeRatio, in the order that keeps min <= max at every step."""
    lo, hi = ratios
    order = [("MinHeapFreeRatio", lo), ("MaxHeapFreeRatio", hi)]
    if lo > int(bean.getVMOption("MaxHeapFreeRatio").getValue()):
        order.reverse()
    for name, value in order:
        bean.setVMOption(name, str(value))


def started() -> bool:
    """Has this process made its SparkSession (:func:`get_spark`)?"""
    return _started_seconds is not None


def startup_seconds() -> float | None:
    """How long the first ``get_spark`` call of this process took (Spark's start-up time)."""
    return _started_seconds


if __name__ == "__main__":
    print(build_class_archive()[1])
