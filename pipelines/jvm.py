"""The JVM engines' class paths: the jars ``headwater setup jars`` (or ``make setup``) resolved.

Spark and Flink are never allowed to download at run time (no ``spark.jars.packages``, no Ivy):
each session is handed the resolved jars explicitly, from one folder
(:func:`headwater.registry.config.jvm_lib_dir`: ``$HEADWATER_JVM_LIB``, else ``jvm_lib`` in
headwater.yaml, else a source checkout's ``infra/lib``, else ``~/.cache/headwater/lib``), and a
missing folder is a clear error that says how to fill it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING

from headwater.registry.config import jvm_lib_dir, state_dir
from headwater.registry.errors import HeadwaterError

if TYPE_CHECKING:
    from pyflink.datastream import StreamExecutionEnvironment
    from pyspark.sql import SparkSession


def lib_dir() -> Path:
    """Return the folder with one sub-folder of jars per group (resolved per call, not at import)."""
    return jvm_lib_dir()


def __getattr__(name: str) -> Path:
    # ``LIB_DIR`` was a constant computed at import; callers that still read it get the resolved folder.
    if name == "LIB_DIR":
        return lib_dir()
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


class MissingJarsError(HeadwaterError, RuntimeError):
    """The JVM artifacts for an engine have not been resolved on this machine."""


def jars(group: str) -> list[Path]:
    """Return the resolved jars of ``group`` (``kafka``, ``flink``, ``flink-udfs`` or ``delta``), sorted.

    ``flink-udfs`` is headwater's own Flink functions (infra/maven/flink-udfs: the realtime
    job's JVM Avro decode) with their dependencies.

    Raises:
        MissingJarsError: the folder is missing or empty.
    """
    folder = lib_dir() / group
    found = sorted(folder.glob("*.jar"))
    if not found:
        msg = (
            f"no jars in {folder} for {group!r}: run `headwater setup jars` (in a source checkout: "
            f"`make setup`), which resolves them with Maven, or point HEADWATER_JVM_LIB (or jvm_lib in "
            f"headwater.yaml) at a folder that has them"
        )
        raise MissingJarsError(msg)
    return found


SPARK_LOG4J2 = """\
# Written by headwater (pipelines/jvm.py): Spark's own log goes to {log}, not the console.
status = error
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{yyyy-MM-dd HH:mm:ss}} %p %c{{1}}: %m%n
"""


def engine_log_dir() -> Path:
    """Return the folder the JVM engines (Spark, Flink) log to: ``<state folder>/logs``, created.

    The console is for headwater's own lines (progress per view and day, warnings, errors); an
    engine's warnings there (``WARN NativeCodeLoader``, log-profile notices) read like problems a
    newcomer must fix. An engine's failure still reaches the console as the exception it raises.
    """
    folder = state_dir() / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def spark_log_options() -> str:
    """Return the driver JVM option that sends Spark's log4j2 output to ``<logs>/spark.log``."""
    folder = engine_log_dir()
    config = folder / "spark-log4j2.properties"
    text = SPARK_LOG4J2.format(log=folder / "spark.log")
    if not config.is_file() or config.read_text(encoding="utf-8") != text:
        tmp = config.with_name(f"{config.name}.{os.getpid()}.tmp")  # concurrent sessions: whole files
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(config)
    return f"-Dlog4j2.configurationFile={config.as_uri()}"


def spark_session(app_name: str, master: str | None = None) -> SparkSession:
    """Build a Spark session with Delta Lake from the resolved jars.

    Local by default (``local[2]`` on this 2-core machine); ``master`` sends the same job to a
    cluster. Adaptive query execution is off, as in the seed's settings, so that plans and
    output file counts are repeatable.
    """
    from pyspark.sql import SparkSession

    # Loopback by default, like every other service of the platform (and no hostname warning).
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    classpath = ",".join(str(jar) for jar in jars("delta"))
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master or os.environ.get("HEADWATER_SPARK_MASTER", "local[2]"))
        .config("spark.jars", classpath)
        .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
        .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.shuffle.partitions", os.environ.get("HEADWATER_SPARK_PARTITIONS", "4"))
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.ui.enabled", "false")
        # Our jobs print their own progress per view and day; Spark's stage bars would interleave.
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.warehouse.dir", str(state_dir() / "spark-warehouse"))
        # Read when spark-submit starts the driver JVM: Spark's log goes to a file (engine_log_dir).
        .config("spark.driver.extraJavaOptions", spark_log_options())
        .config("spark.driver.memory", os.environ.get("HEADWATER_SPARK_DRIVER_MEMORY", "4g"))
        # The training set's user side chains ~7 sort-merge joins on (user_id, event_time) and
        # their aggregations into one task; each operator takes a page of the task's ~1.1 GB of
        # execution memory, and at the 64 MB default the chain cannot get its pages
        # (SparkOutOfMemoryError UNABLE_TO_ACQUIRE_MEMORY on 40k labels). 2 MB pages fit it.
        .config("spark.buffer.pageSize", os.environ.get("HEADWATER_SPARK_PAGE_SIZE", "2m"))
    )
    _launch_quiet_gateway(builder._options)  # the builder's own options, as getOrCreate hands them on
    return builder.getOrCreate()


JVM_NOTICES = frozenset({b"WARNING: Using incubator modules: jdk.incubator.vector"})
"""Lines the driver JVM prints itself at start that report nothing to fix: Spark's launcher adds the
incubating Vector API module (its vectorised BLAS), and the JVM announces every incubator module."""


def _launch_quiet_gateway(options: dict[str, str]) -> None:
    """Start the Spark driver JVM (the py4j gateway) with its stderr passed through a filter.

    PySpark starts the JVM at the first session of a process, inheriting the console; this starts it
    the same way (``launch_gateway`` with the session's options, read at JVM start: driver memory,
    Java options) but with stderr piped through a thread that drops :data:`JVM_NOTICES` and copies
    every other line to our stderr as it comes, so an engine's real complaint still shows. Nothing
    happens when the gateway is already up (a later session of the process) or given from outside.
    """
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return
    conf = SparkConf(loadDefaults=False)
    conf.setAll(list(options.items()))
    with SparkContext._lock:
        if SparkContext._gateway is not None:
            return
        gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})  # type: ignore[no-untyped-call]
        SparkContext._gateway = gateway
        SparkContext._jvm = gateway.jvm
    proc = getattr(gateway, "proc", None)
    if proc is not None and proc.stderr is not None:
        threading.Thread(target=_copy_stderr, args=(proc.stderr,), name="spark-stderr", daemon=True).start()


def _copy_stderr(stream: IO[bytes]) -> None:
    """Copy the JVM's stderr lines to ours, but the :data:`JVM_NOTICES` (until the JVM exits).

    It reads to the end whatever happens to our stderr: a pipe nobody drains would block the JVM.
    """
    for line in iter(stream.readline, b""):
        if line.rstrip(b"\r\n") in JVM_NOTICES:
            continue
        try:
            sys.stderr.write(line.decode("utf-8", "replace"))
            sys.stderr.flush()
        except (OSError, ValueError):  # our stderr closed or replaced at exit: keep draining
            pass


def flink_environment(parallelism: int = 2) -> StreamExecutionEnvironment:
    """Build a PyFlink stream environment with the Kafka connector on its class path.

    The Python workers are pinned to this interpreter: PyFlink otherwise runs ``python`` from
    PATH, which outside an activated venv has no pyflink ("No module named 'pyflink'").
    """
    from pyflink.datastream import StreamExecutionEnvironment

    set_flink_java_args()
    env = StreamExecutionEnvironment.get_execution_environment()
    env.set_parallelism(parallelism)
    env.add_jars(*(jar.as_uri() for jar in jars("flink")))
    env.set_python_executable(sys.executable)
    return env


def jvm_temp_dir(engine: str) -> Path:
    """Return this process's temporary folder for an engine's JVM, after removing dead processes' ones.

    A PyFlink gateway JVM extracts the table planner (a ~45 MB ``flink-table-planner_*.jar``) and
    keeps its blobs and spill files under ``java.io.tmpdir``, and deletes them at a clean JVM exit
    only; PyFlink kills its JVM when the interpreter exits, so every run (and every ``kill -9`` of a
    supervised restart) left ~89 MB in /tmp for good. Each process gets
    ``<tmp>/headwater-<uid>/<engine>/<pid>``; the folders of processes no longer alive are removed
    here, so the next start clears up after an ended one. Not under the state folder: a test's state
    folder is deleted while the process's JVM lives on.
    """
    root = _temp_root(engine)
    root.mkdir(parents=True, exist_ok=True)
    for folder in root.iterdir():
        if folder.name.isdigit() and not _alive(int(folder.name)):
            shutil.rmtree(folder, ignore_errors=True)
    mine = root / str(os.getpid())
    mine.mkdir(exist_ok=True)
    return mine


def set_flink_java_args(jvm_heap: str | None = None) -> None:
    """Set ``JVM_ARGS`` for the PyFlink gateway JVM this process may start (read when it starts).

    ``jvm_heap`` sets ``-Xmx`` unless the caller's ``JVM_ARGS`` already exists (the caller's wins);
    the JVM's temporary folder is :func:`jvm_temp_dir` unless the caller set ``java.io.tmpdir``.
    A folder of ours inherited from a parent process's ``JVM_ARGS`` is replaced by this process's
    own: the parent's is removed once the parent ends, even while this process's JVM still uses it.
    """
    os.environ.setdefault("FLINK_LOG_DIR", str(engine_log_dir()))  # not site-packages/pyflink/log
    root = _temp_root("flink")
    ours, mine = f"-Djava.io.tmpdir={root}{os.sep}", f"-Djava.io.tmpdir={root / str(os.getpid())}"
    given = os.environ.get("JVM_ARGS") or (f"-Xmx{jvm_heap} -XX:+UseG1GC" if jvm_heap else "")
    args = [a for a in given.split() if a == mine or not a.startswith(ours)]
    if not any(a.startswith("-Djava.io.tmpdir=") for a in args):  # the sweep once, not at every call
        args.append(f"-Djava.io.tmpdir={jvm_temp_dir('flink')}")
    os.environ["JVM_ARGS"] = " ".join(args)


def _temp_root(engine: str) -> Path:
    return Path(tempfile.gettempdir()) / f"headwater-{os.getuid()}" / engine


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
