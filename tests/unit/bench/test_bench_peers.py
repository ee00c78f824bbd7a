"""The pure parts of the benchmarks' peers: bench.e2e's table of systems and its report rows
for a Kafka-protocol peer, the Kafka node's ``server.properties``, SCRAM options and cluster id,
bench.kafka_tls's paired ratios, and the latency rows of mq's wait strategies beside mp.Queue
and ZeroMQ. No broker runs here (tests/integration/test_bench_kafka_wire.py
starts real ones)."""

from __future__ import annotations

import base64
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:                 # bench/ is not an installed package
    sys.path.insert(0, str(ROOT))

from bench import e2e, e2e_systems, kafka_tls
from bench.kafka_peer import random_cluster_id, scram_arguments, server_properties


def _props(lines: list[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines if line)


def test_plaintext_node_has_one_client_listener():
    p = _props(server_properties("/w", 9092, 9093))
    assert p["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"
    assert p["listener.security.protocol.map"] == "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    assert not any(k.startswith(("ssl.", "sasl.")) for k in p)
    assert p["log.dirs"] == "/w/data"


def test_sasl_ssl_node_adds_a_scram_listener_with_a_pem_key_store():
    p = _props(server_properties("/w", 9092, 9093, 9094, "/w/keystore.pem"))
    assert p["listeners"].split(",") == ["PLAINTEXT://127.0.0.1:9092",
                                         "SASL_SSL://127.0.0.1:9094",
                                         "CONTROLLER://127.0.0.1:9093"]
    assert p["advertised.listeners"] == p["listeners"]
    assert "SASL_SSL:SASL_SSL" in p["listener.security.protocol.map"].split(",")
    assert p["inter.broker.listener.name"] == "PLAINTEXT"
    assert p["sasl.enabled.mechanisms"] == "SCRAM-SHA-256"
    assert p["ssl.keystore.type"] == "PEM" and p["ssl.keystore.location"] == "/w/keystore.pem"
    assert p["listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config"].endswith("required;")


def test_scram_users_become_format_options():
    assert scram_arguments({}) == []
    assert scram_arguments({"a": "x", "b": "y"}) == [
        "--add-scram", "SCRAM-SHA-256=[name=a,password=x]",
        "--add-scram", "SCRAM-SHA-256=[name=b,password=y]"]


def test_cluster_ids_are_kafka_uuids_that_never_look_like_options():
    ids = {random_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for text in ids:                          # Kafka's Uuid.toString: 22 URL-safe characters
        assert len(text) == 22 and not text.startswith("-")
        assert len(base64.urlsafe_b64decode(text + "==")) == 16


def test_e2e_systems_are_a_table_with_mq_first():
    assert e2e.SYSTEMS[0] == "mq" and e2e.PEERS == list(e2e_systems.PEERS)
    assert e2e.PEERS[:5] == ["mp.Queue", "redis", "nats", "zmq", "sqlite"]
    assert e2e.KAFKA_PROTOCOL == ["kafka", "mq-kafka", "tansu"]
    for name, cls in e2e_systems.PEERS.items():
        assert cls.name == name and cls.label and len(cls.guess) == len(e2e.SIZES)
        assert cls.sections <= {"throughput", "latency"}
    labels = [c.label for c in e2e_systems.PEERS.values()]
    assert len(set(labels)) == len(labels)


def test_listener_against_kafka_is_paired_per_run_when_both_ran():
    per = {"kafka": [{"rate": 100.0}, {"rate": 200.0}],
           "mq-kafka": [{"rate": 150.0}, {"rate": 100.0}], "mq": [{"rate": 1.0}] * 2}
    assert e2e.listener_vs_kafka(per, "rate")["runs"] == [1.5, 0.5]
    assert e2e.listener_vs_kafka({"kafka": per["kafka"]}, "rate") is None


def _s(median: float) -> dict:
    return {"median": median, "min": median * 0.9, "max": median * 1.1}


def test_e2e_table_shows_a_kafka_peer_beside_mq():
    tp = {"sizes": {"100B": {"rate": {"mq": _s(4e5), "kafka": _s(2e5)},
                             "mb_s": {"mq": _s(40), "kafka": _s(20), "raw": _s(2000)},
                             "ratio": {"kafka": _s(2.0), "raw": _s(0.02)},
                             "listener_vs_kafka": _s(1.25)}}}
    lat = {"runs": {"mq": [{}], "redis": [{}], "kafka": [{}, {}]}, "p50_ratio_vs_redis": _s(1.5),
           "p50_ratio_vs": {"kafka": _s(0.5)}}
    for s in ("mq", "redis", "kafka"):
        lat[s] = {"merged": {"p50_us": 300, "p99_us": 900, "p99_9_us": 2000, "max_us": 3000},
                  "saturated_runs": 0, "achieved_rate": _s(1000)}
    rows = e2e.build_table({"throughput": tp, "latency": {"rates": {"1000": lat}}})
    by_name = {r["benchmark"]: r for r in rows}
    kafka = by_name[f"1->1 100B {e2e_systems.ApacheKafka.label}"]
    assert kafka["ratio"].startswith("2.00x")
    pair = by_name["1->1 100B mq's Kafka listener / Apache Kafka (same librdkafka workers)"]
    assert pair["ratio"].startswith("1.25x Kafka's rec/s")
    row = by_name[f"e2e 1 k/s 100 B {e2e_systems.ApacheKafka.label} (acks=1, linger 0)"]
    assert row["ratio"].startswith("0.50x (mq p50/this)")
    assert not any("mq-kafka" in name or "Tansu" in name for name in by_name)


def test_e2e_latency_peers_include_mp_queue_and_zeromq():
    for name in ("mp.Queue", "redis", "zmq", *e2e.KAFKA_PROTOCOL):
        assert "latency" in e2e_systems.PEERS[name].sections
    assert e2e.MQ_LATENCY_ROWS[:3] == ("mq", "mq-spin", "mq-cspin")
    assert e2e.LATENCY_RATES == (1000, 10_000, 50_000)


def _lat(p50: float, saturated: int = 0, server: bool = True) -> dict:
    cpu = {"producer": _s(10), "consumer": _s(5), "server": _s(20) if server else None}
    return {"merged": {"p50_us": p50, "p99_us": 3 * p50, "p99_9_us": 5 * p50,
                       "max_us": 9 * p50}, "saturated_runs": saturated,
            "achieved_rate": _s(1000), "cpu_us_per_msg": cpu}


def test_e2e_latency_table_puts_each_wait_strategy_beside_mp_queue():
    def entry(mpq_saturated: int) -> dict:
        return {"runs": {s: [{}] for s in ("mq", "mq-spin", "mp.Queue", "zmq", "redis")},
                "mq": _lat(60), "mq-spin": _lat(25),
                "mp.Queue": _lat(20, mpq_saturated, False), "zmq": _lat(30, 1, False),
                "redis": _lat(150), "p50_ratio_vs_redis": _s(0.4),
                "p50_ratio_vs": {"zmq": _s(2.0)},
                "p50_ratio_vs_mpq": {"mq": _s(3.0), "mq-spin": _s(1.25)}}
    rows = {r["benchmark"]: r for r in e2e.build_table(
        {"latency": {"rates": {"1000": entry(0), "50000": entry(1)}}})}
    blocking = rows["e2e 1 k/s 100 B mq (acks=1, linger 0, blocking)"]
    assert blocking["figure"].endswith("; CPU/msg producer 10.0, consumer 5.0, server 20.0")
    mpq = rows["e2e 1 k/s 100 B mp.Queue"]
    assert mpq["figure"].endswith("; CPU/msg producer 10.0, consumer 5.0")
    assert mpq["ratio"].startswith("3.00x (mq blocking p50/this)")
    assert (mpq["goal"], mpq["met"]) == ("mq blocking p50 <= 1.5x", "NO")
    spin = rows["e2e 1 k/s 100 B mq (acks=1, linger 0, spin) / mp.Queue"]
    assert spin["ratio"].startswith("1.25x mp.Queue p50")
    assert rows["e2e 1 k/s 100 B ZeroMQ PUSH/PULL ipc"]["ratio"] == "- (saturated)"
    # At 50 k/s the saturated mp.Queue is compared with nothing, and no goal holds there.
    assert rows["e2e 50 k/s 100 B mp.Queue"]["ratio"] == "- (saturated)"
    assert rows["e2e 50 k/s 100 B mp.Queue"]["goal"] == "-"
    assert "e2e 50 k/s 100 B mq (acks=1, linger 0, spin) / mp.Queue" not in rows


def _runs(*cpu: float) -> list[dict]:
    return [{"cpu_s_per_gb": c} for c in cpu]


def test_tls_cost_is_paired_run_by_run_for_each_broker():
    per = {("mq", "plain"): _runs(1.0, 2.0), ("mq", "tls"): _runs(2.0, 3.0),
           ("kafka", "plain"): _runs(4.0, 4.0), ("kafka", "tls"): _runs(6.0, 8.0)}
    cmp = kafka_tls.compare(per)
    assert cmp["tls_vs_plain"]["mq"]["runs"] == [2.0, 1.5]
    assert cmp["tls_vs_plain"]["kafka"]["median"] == 1.75
    assert cmp["mq_vs_kafka"]["plain"]["runs"] == [0.25, 0.5]
    assert cmp["sides"]["kafka tls"]["max"] == 8.0
    lines = kafka_tls.report_lines("fetch x1", cmp)
    assert "fetch x1 kafka SASL_SSL/PLAINTEXT: 1.75x (1.50-2.00)" in lines
    assert any(line.startswith("fetch x1 mq/Kafka on tls") for line in lines)


def test_tls_cost_of_one_broker_has_no_cross_ratio():
    cmp = kafka_tls.compare({("kafka", "plain"): _runs(1.0), ("kafka", "tls"): _runs(3.0)})
    assert "mq_vs_kafka" not in cmp and list(cmp["tls_vs_plain"]) == ["kafka"]


def test_a_paced_loop_gives_up_on_a_system_far_slower_than_its_rate(monkeypatch):
    """A saturated peer would keep the open loop for many times the run's length (Redis at
    50 k/s on a slow box: 70 s for 5.5 s of records): the loop stops ``SEND_SLACK_S`` after
    its last intended send and says how many went out."""
    import time

    from bench import peers
    monkeypatch.setattr(peers, "SEND_SLACK_S", 0.05)
    calls: list[int] = []

    def slow(t_i: int) -> None:
        calls.append(t_i)
        time.sleep(0.01)

    res = peers.paced_loop(slow, 10_000, 1_000)          # 0.1 s of records, 10 ms a send
    assert res["n"] == 1_000 and res["sent"] == len(calls) < 100
    assert peers.paced_loop(lambda t_i: None, 10_000, 100)["sent"] == 100


def test_a_blocked_consumer_stops_at_the_end_marker():
    """After a loop that gave up, ``_paced`` sends an empty value; a consumer blocked in
    ``recv()`` (``mp.Queue``, ZeroMQ) stops there with what it got."""
    import struct
    import time

    from bench import peers
    stamp = struct.Struct("<q").pack
    values = iter([stamp(time.perf_counter_ns()) + b"x" * 92 for _ in range(5)] + [b""])
    res = peers._recv_latencies(lambda: None, values.__next__, 1_000, 1)
    assert res["n"] == 5


def test_a_blocking_consumer_times_each_message_when_it_arrives():
    """The receive time is read after ``recv()`` returns: a message that took 5 ms to come
    is recorded at 5 ms or more, not at the time the wait began."""
    import struct
    import time

    from bench import peers
    from bench.harness import hist_stats, merge_hists
    stamp = struct.Struct("<q").pack

    def recv() -> bytes:
        sent = time.perf_counter_ns()
        time.sleep(0.005)
        return stamp(sent) + b"x" * 92

    res = peers._recv_latencies(lambda: None, recv, 4, 0)
    assert hist_stats(merge_hists([res["hist"]]))["p50_us"] >= 5_000
