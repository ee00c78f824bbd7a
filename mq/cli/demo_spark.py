"""``mq demo --spark``: the pipeline of ``mq.spark.pipeline`` with real processes, in one
command, from nothing to a checked summary.

1. PySpark, PyArrow and Java 17 are checked first: a missing one is one ``mq: error:`` line
   saying how to install it (exit 1), before anything starts.
2. The broker: the one at ``--socket``; else the one on ``--data-dir``, started there when none
   answers; else one started on a temporary data dir. The topics ``orders`` (``--partitions``)
   and ``order-totals`` are created afresh, so the counts are exact.
3. The producer processes (``demo_spark_orders``) are forked *before* Spark starts (a JVM
   gateway and its threads are not to be forked) and wait for a go.
4. Spark in local mode (``local[2]``). ``$MQ_SOCKET`` is set to the broker's socket before the
   JVM starts, so every Python worker Spark starts finds the broker: the pipeline names no
   broker, which keeps its move to Kafka to ``format`` and ``kafka.bootstrap.servers``. The
   JVM's output and the Python workers' stderr go to ``spark.log`` in the work directory,
   Spark's scratch files to ``spark-local`` there (removed at the end).
5. Both queries start (1 s trigger) and run their first micro-batch, the slow one (Python
   workers start, code is generated: 5-25 s on a busy 2-core box), on a *start-of-stream
   event*: ``{"start_of_stream": true}``, which has no event time, so the window drops it.
   Then the producers go. Progress on stderr every 2 s.
6. The producers done, an *end-of-stream event* (only an event time, a window and a watermark
   past now) moves the watermark past the last window, so every window is written (append
   mode writes a window once the watermark passes its end; the event's own window never
   closes). The demo waits until both queries have read every offset and their state holds
   only that event's group, then stops them.
7. The summary (``demo_spark_report``) reads the results back, from Parquet (through Spark)
   and from the topic (a ``read_committed`` consumer), and checks them against what the
   producers sent. Then Spark, the producers and a broker the demo started stop; temporary
   directories are removed (kept after a failure, and named in the error).

With ``--bootstrap-server`` the same runs on a Kafka cluster (``demo_spark_kafka``): no
broker is started, the clients get ``bootstrap_servers=``, the query ``format("kafka")``
through Spark's own Kafka connector. Its sink is at least once, so the check takes Parquet
(exactly once) as the truth and the topic's totals once per (window, customer).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from mq.cli.common import start_broker
from mq.cli.demo_spark_kafka import ORDERS, TOTALS, Cluster, probe, recreate_topics
from mq.cli.demo_spark_orders import Producers, iso_ms
from mq.errors import MQError

__all__ = ["add_arguments", "run", "wants_spark"]

PRODUCERS = 2
PROGRESS_S = 2.0
STALL_S = 120.0             # nothing moved this long (queries, producers): give up
INSTALL_PYSPARK = "pip install 'mq[spark]'"
INSTALL_JAVA = "apt-get install openjdk-17-jre-headless"


SPARK_HELP = f"""\
Producer processes write order events (JSON) to the topic 'orders'; a Structured Streaming
query reads them with format("mq"), parses them, totals them per customer over 5 s event-time
windows with a 5 s watermark, and writes the totals to the topic 'order-totals' (exactly once
per micro-batch) and to Parquet files. Progress (rows/s in and out, batches, lag) goes to
stderr, the summary (rates, end-to-end lag, checks, sample totals) to stdout. The same query
runs on Apache Kafka with format("kafka") and kafka.bootstrap.servers (mq.spark.pipeline).

Without --socket or --data-dir the broker runs on a temporary data dir; without --output the
Parquet files and checkpoints go to a temporary dir; both are removed at the end. Spark runs
in local mode (local[2]): its executors read the broker's log files. Needs PySpark
({INSTALL_PYSPARK}) and Java 17 ({INSTALL_JAVA}).

On a Kafka cluster (--bootstrap-server): no local broker; the producers are mq.Producer with
bootstrap_servers, the query reads and writes with format("kafka") through Spark's own Kafka
connector (spark-sql-kafka-0-10, which Spark fetches from Maven Central once, or
--connector-jars), and the topics are 'mq-demo-orders' and 'mq-demo-order-totals' (deleted
and created afresh). Kafka's sink is at least once (no transactions): the check takes the
Parquet files (exactly once) as the truth and each (window, customer) of the topic once."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("the Spark pipeline (--spark)", SPARK_HELP)
    group.add_argument("--spark", action="store_true",
                       help="run the Spark pipeline instead of producers and consumers")
    group.add_argument("--rate", type=int, metavar="N",
                       help="orders per second, all producers together (default 10000; 0: as "
                            "fast as they go)")
    group.add_argument("--output", metavar="DIR",
                       help="keep the Parquet files, checkpoints and spark.log in DIR (new or "
                            "empty)")
    group.add_argument("--bootstrap-server", metavar="HOST:PORT[,...]",
                       help="run on this Kafka cluster instead of a local broker")
    group.add_argument("--command-config", metavar="FILE",
                       help="the cluster's client properties (librdkafka's names, "
                            "key=value lines: security.protocol, sasl.mechanism, "
                            "sasl.username, sasl.password, ssl.ca.location...), also "
                            "given to Spark's connector")
    group.add_argument("--connector-jars", metavar="JAR[,JAR...]",
                       help="Spark's Kafka connector and its dependencies on disk (globs "
                            "allowed: spark-sql-kafka-0-10, spark-token-provider-kafka-0-10, "
                            "kafka-clients, commons-pool2), instead of fetching it")


def wants_spark(args: argparse.Namespace) -> bool:
    """Whether ``mq demo`` runs the Spark pipeline. Raises ``ValueError`` (a usage error) for
    Spark-only options without ``--spark``."""
    if not args.spark and any(value is not None for value in (
            args.rate, args.output, args.bootstrap_server, args.command_config,
            args.connector_jars)):
        raise ValueError("--rate, --output, --bootstrap-server, --command-config and "
                         "--connector-jars go with --spark")
    return args.spark


# --- requirements -----------------------------------------------------------------------------

def check_requirements() -> None:
    """Raise ``MQError`` (one line: what to install) when PySpark, PyArrow or Java 17 is
    missing."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as err:
        raise MQError(f"mq demo --spark needs PySpark and PyArrow ({err.name} is missing): "
                      f"{INSTALL_PYSPARK}") from err
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    how = f"{INSTALL_JAVA}, or set JAVA_HOME"
    if not java or not os.access(java, os.X_OK):
        where = "in $JAVA_HOME" if home else "on PATH"
        raise MQError(f"mq demo --spark needs Java 17 (no java {where}): {how}")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise MQError(f"mq demo --spark: {java} -version failed ({err}): {how}") from err
    found = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    major = int(found.group(1)) if found else 0
    major = int(found.group(2) or 0) if major == 1 else major      # "1.8.0" is Java 8
    if major < 17:
        raise MQError(f"mq demo --spark needs Java 17 or later, {java} is "
                      f"{'Java %d' % major if major else 'of an unknown version'}: {how}")


# --- the broker, Spark and the queries --------------------------------------------------------

def _step(text: str) -> None:
    sys.stderr.write(f"mq demo: {text}\n")
    sys.stderr.flush()


def _broker(args: argparse.Namespace, temp: str):
    """(socket, the broker process started here or None, data dir)."""
    from mq.client.admin import Admin
    from mq.errors import BrokerUnavailableError

    if args.socket:
        with Admin(args.socket, timeout=10) as admin:
            info = admin.broker_info
        _step(f"using the broker at {args.socket} (pid {info.get('pid')})")
        return args.socket, None, info.get("data_dir")
    data_dir = os.path.abspath(os.path.expanduser(args.data_dir)) if args.data_dir \
        else os.path.join(temp, "data")
    if args.data_dir:
        with contextlib.suppress(BrokerUnavailableError):
            probe = os.path.join(data_dir, "mq.sock")
            with Admin(probe, timeout=10) as admin:
                info = admin.broker_info
            _step(f"using the broker already running at {probe} (pid {info.get('pid')})")
            return probe, None, data_dir
    _step(f"starting a broker on {data_dir}")
    broker = start_broker(data_dir)
    return broker.socket, broker, data_dir


@contextlib.contextmanager
def _output_to(path: str):
    """Point descriptors 1 and 2 at ``path`` while the JVM starts: it keeps them, and so do
    the Python workers it starts later; this process gets its own back."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def _spark(work: str, socket: str | None, conf: dict[str, str]):
    """Local-mode Spark, for the broker at ``socket`` or (None) a Kafka cluster, with the
    settings ``conf`` (the Kafka connector's)."""
    if socket is not None:
        os.environ["MQ_SOCKET"] = socket        # the pipeline names no broker (module doc)
    os.environ["PYSPARK_PYTHON"] = sys.executable     # workers import mq from this Python
    from pyspark.sql import SparkSession

    import mq.spark
    log = os.path.join(work, "spark.log")
    try:
        with _output_to(log):
            spark = (SparkSession.builder.master("local[2]").appName("mq demo --spark")
                     .config("spark.ui.enabled", "false")
                     .config("spark.ui.showConsoleProgress", "false")
                     .config("spark.sql.shuffle.partitions", "2")
                     .config("spark.sql.session.timeZone", "UTC")
                     .config("spark.driver.memory", "1g")
                     .config("spark.local.dir", os.path.join(work, "spark-local"))
                     .config(map=conf)
                     .getOrCreate())
    except Exception as err:        # PySparkRuntimeError: the JVM died or did not answer
        raise MQError(f"Spark did not start ({str(err).splitlines()[0]}); its output is in "
                      f"{log}") from err
    mq.spark.register(spark)
    return spark


def _end_offsets(admin, topic: str) -> dict[tuple[str, str], int]:
    return {(topic, str(p)): end
            for p, (_, end) in enumerate(admin.describe_topic(topic)["offsets"])}


def _send_event(clients: dict, topic: str, value: str) -> None:
    """One event (a start or end of stream: module doc), acknowledged."""
    from mq.client.producer import Producer
    with Producer(**clients) as producer:
        producer.send(topic, value.encode(), partition=0).get(timeout=60)


def _poll(queries: list, stats: list) -> None:
    """Take the queries' new progress reports in; raise ``MQError`` if one failed."""
    for query, s in zip(queries, stats, strict=True):
        if not query.isActive:
            raise _query_error(query)
        for progress in query.recentProgress:
            s.add(progress)


def _warm_up(admin, clients: dict, queries: list, stats: list, topic: str) -> None:
    """Have each query run its first micro-batch, on a start-of-stream event (module doc)."""
    _send_event(clients, topic, '{"start_of_stream": true}')
    ends = _end_offsets(admin, topic)
    deadline = time.monotonic() + STALL_S
    while not all(s.has_read(ends) for s in stats):
        _poll(queries, stats)
        if time.monotonic() > deadline:
            raise MQError(f"the queries did not run a first micro-batch within {STALL_S:.0f} s")
        time.sleep(0.1)


def _query_error(query) -> MQError:
    err = query.exception()
    text = str(err).strip().splitlines()[0] if err is not None else "stopped"
    return MQError(f"the Spark query {query.name} failed: {text}")


def _watch(admin, clients: dict, producers: Producers, queries: list, stats: list,
           topic: str) -> None:
    """Progress lines until both queries wrote every window (module doc, steps 5 and 6)."""
    from mq.cli.demo_spark_report import progress_line
    from mq.spark.pipeline import WATERMARK_S, WINDOW_S
    history: list[tuple[float, int]] = []
    final = None
    start = last_change = time.monotonic()
    last_state = None
    next_line = start + PROGRESS_S
    while True:
        producers.collect(0.2)
        now = time.monotonic()
        _poll(queries, stats)
        produced = sum(_end_offsets(admin, topic).values())
        history.append((now, produced))
        if final is None and producers.finished:
            event_ms = int(time.time() * 1000) + (WINDOW_S + WATERMARK_S + 1) * 1000
            _send_event(clients, topic, f'{{"event_time": "{iso_ms(event_ms)}", '
                        '"end_of_stream": true}')
            final = _end_offsets(admin, topic)
            _step(f"producers done; an end-of-stream event at {iso_ms(event_ms)} moves the "
                  "watermark past the last window; waiting for the queries")
        if final is not None and all(s.caught_up(final) for s in stats):
            return
        state = (produced, tuple((len(s.batches), s.processed) for s in stats))
        if state != last_state:
            last_state, last_change = state, now
        elif now - last_change > STALL_S:
            raise MQError(f"nothing moved for {STALL_S:.0f} s (produced {produced:,}; read "
                          f"{', '.join(f'{s.name} {s.processed:,}' for s in stats)})")
        if now >= next_line:
            next_line = now + PROGRESS_S
            past = [n for t, n in history if t <= now - 5.0] or [history[0][1]]
            rate = (produced - past[-1]) / min(5.0, max(now - history[0][0], 1e-9))
            _step(progress_line(now - start, produced, rate, stats, history, time.time(), now))


# --- the run ----------------------------------------------------------------------------------

def _read_totals(clients: dict, topic: str) -> list[tuple[int, dict]]:
    """(record timestamp ms, total) of every committed record of the results topic."""
    from decimal import Decimal

    from mq.client.consumer import Consumer
    out = []
    with Consumer(topic, value_bytes=True, **clients,
                  isolation_level="read_committed") as consumer:
        consumer.seek_to_beginning()
        tps = sorted(consumer.assignment())
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=1000).values():
                out += [(r.timestamp_ms, json.loads(r.value, parse_float=Decimal))
                        for r in records]
    return out


def _parquet_totals(spark, path: str) -> list[dict]:
    """The totals in Parquet, as the same JSON dicts as the topic's (Spark's ``to_json``)."""
    from decimal import Decimal

    from pyspark.sql import functions as F
    frame = spark.read.parquet(path)
    return [json.loads(row[0], parse_float=Decimal)
            for row in frame.select(F.to_json(F.struct(*frame.columns))).collect()]


def _check_args(args: argparse.Namespace) -> None:
    if not 1 <= args.partitions <= 1000:
        raise ValueError(f"--partitions must be between 1 and 1000, got {args.partitions}")
    if not 2 <= args.records <= 100_000_000:
        raise ValueError(f"--records must be between 2 and 100000000, got {args.records}")
    if args.rate is not None and args.rate < 0:
        raise ValueError(f"--rate must be >= 0, got {args.rate}")
    if args.output and os.path.isdir(args.output) and os.listdir(args.output):
        raise ValueError(f"--output {args.output} is not empty (the demo recreates its topics, "
                         "so an earlier run's checkpoints would not match them)")


def run(args: argparse.Namespace) -> int:
    """``mq demo --spark`` (module doc). Raises ``MQError`` (one line) on failure."""
    _check_args(args)
    check_requirements()
    cluster = Cluster.from_args(args)           # after: mq.spark's modules import PySpark
    if cluster is not None:
        probe(cluster)
    temp = tempfile.mkdtemp(prefix="mq-demo-spark-")
    work = os.path.abspath(args.output) if args.output else os.path.join(temp, "output")
    os.makedirs(work, exist_ok=True)
    keep = False
    broker = None
    try:
        if cluster is None:
            socket, broker, data_dir = _broker(args, temp)
            clients = {"socket": socket}
        else:
            _step(f"using the Kafka cluster at {cluster.servers}")
            clients = cluster.clients
        summary, problems = _pipeline(args, clients, cluster, work)
    except MQError as err:
        if not os.path.exists(os.path.join(work, "spark.log")):
            raise                                   # before Spark: nothing to look at
        keep = bool(os.listdir(temp))
        where = f"kept in {temp}" if keep else f"in {work}"
        raise MQError(f"{err} (Spark's log and the data are {where})") from err
    finally:
        if broker is not None:
            _step("stopping the broker")
            broker.close()
        shutil.rmtree(os.path.join(work, "spark-local"), ignore_errors=True)
        if not keep:
            shutil.rmtree(temp, ignore_errors=True)
    out = sys.stdout.write
    out(summary)
    if problems:
        return 1
    out("\n")
    if args.output:
        out(f"Kept in {work}: order-totals.parquet (the totals), checkpoints/ (the queries'), "
            "spark.log\n")
    else:
        out("The Parquet files and checkpoints were in a temporary dir, now removed "
            "(--output DIR keeps them).\n")
    if cluster is not None:
        out(f"The topics {ORDERS} and {TOTALS} stay on the cluster.\nTry next:\n"
            f"  mq consume {TOTALS} --bootstrap-server {cluster.servers} --from-beginning "
            "--max-messages 5 --print-key\n")
    elif not (args.data_dir or args.socket):
        out("The broker's data dir was temporary too, now removed (--data-dir DIR keeps the "
            "topics).\n")
    else:
        out("Try next:\n")
        if broker is not None:
            out(f"  mq broker --data-dir {data_dir} &\n")
        where = f" --socket {socket}" if args.socket else ""
        out(f"  mq consume order-totals --from-beginning --isolation-level read_committed "
            f"--max-messages 5 --print-key{where}\n")
    return 0


def _topics(admin, cluster: Cluster | None, partitions: int) -> tuple[str, str]:
    """The orders and totals topics, created afresh: (orders, totals)."""
    from mq.spark import pipeline
    if cluster is not None:
        recreate_topics(admin, (ORDERS, TOTALS), partitions)
        return ORDERS, TOTALS
    for name in (pipeline.ORDERS, pipeline.TOTALS):
        if name in admin.list_topics():
            admin.delete_topic(name)
        admin.create_topic(name, partitions)
    return pipeline.ORDERS, pipeline.TOTALS


def _start_queries(spark, cluster: Cluster | None, orders: str, totals_topic: str,
                   work: str) -> list:
    """The two queries of ``mq.spark.pipeline``: to the topic and to Parquet. Raises
    ``MQError`` when Spark refuses them (no Kafka connector on the class path, a bad
    option)."""
    from pyspark.errors import PySparkException

    from mq.spark import pipeline
    fmt, servers, options = ("mq", None, None) if cluster is None else \
        ("kafka", cluster.servers, cluster.options())
    checkpoints = os.path.join(work, "checkpoints")
    queries: list = []
    try:
        totals = pipeline.order_totals(spark, fmt, servers, orders, options)
        queries.append(pipeline.to_topic(totals, os.path.join(checkpoints, f"to-{fmt}"), fmt,
                                         servers, totals_topic, options=options))
        queries.append(pipeline.to_parquet(totals, os.path.join(work, "order-totals.parquet"),
                                           os.path.join(checkpoints, "to-parquet")))
    except PySparkException as err:
        for query in queries:
            query.stop()
        raise MQError(f"Spark refused the query: {str(err).strip().splitlines()[0]}") from err
    return queries


def _pipeline(args: argparse.Namespace, clients: dict, cluster: Cluster | None, work: str
              ) -> tuple[str, list[str]]:
    """Topics, producers, Spark and the two queries, the watch, the summary; everything this
    starts is stopped before it returns or raises. ``clients``: the mq clients' keyword
    arguments (``socket=``, or a cluster's)."""
    from mq.cli.demo_spark_report import QueryStats, report
    from mq.client.admin import Admin
    from mq.spark import pipeline

    with Admin(**clients) as admin:
        orders, totals_topic = _topics(admin, cluster, args.partitions)
    rate = 10_000 if args.rate is None else args.rate
    producers = Producers(clients, orders, args.records, rate, PRODUCERS)
    producers.start()
    spark = None
    queries: list = []
    try:
        producers.wait_ready()
        fetch = "; it fetches Spark's Kafka connector from Maven Central the first time" \
            if cluster is not None and not cluster.jars else ""
        _step(f"starting Spark (local[2]); its output goes to {work}/spark.log{fetch}")
        spark = _spark(work, clients.get("socket"),
                       cluster.spark_conf() if cluster is not None else {})
        queries = _start_queries(spark, cluster, orders, totals_topic, work)
        stats = [QueryStats(q.name) for q in queries]
        _step(f"queries {' and '.join(q.name for q in queries)} started; their first "
              "micro-batch (Python workers start, code is generated) runs on a start-of-stream "
              "event, before the orders")
        with Admin(**clients) as admin:
            _warm_up(admin, clients, queries, stats, orders)
            _step(f"{PRODUCERS} producers write {args.records:,} orders to "
                  f"'{orders}' ({args.partitions} partitions) at "
                  f"{f'{rate:,}/s' if rate else 'full speed'}")
            since = time.time()
            producers.go.set()
            _watch(admin, clients, producers, queries, stats, orders)
        for query in queries:
            query.stop()
        _step("every window written; reading the results back")
        return report(args.records, args.partitions, list(producers.done.values()), stats,
                      since, _read_totals(clients, totals_topic),
                      _parquet_totals(spark, os.path.join(work, "order-totals.parquet")),
                      pipeline.WATERMARK_S, cluster=cluster.servers if cluster else None,
                      orders_topic=orders, totals_topic=totals_topic)
    finally:
        for query in queries:
            with contextlib.suppress(Exception):
                query.stop()
        if spark is not None:
            spark.stop()
        producers.stop()
