"""The tests of mq's clients on a Kafka cluster (issue 24): one contract, two backends.

``backend`` runs each test twice: against mq's own Kafka listener (a broker per test, on the
test's ``tmp_path``) and against a real three-node Apache Kafka cluster (``kafka_cluster``,
one per test session, shared by every test and xdist worker). The tests talk to both through
``bootstrap_servers=``, so both are held to the same behaviour; names are unique per test
(``backend.name(...)``) because the cluster is shared.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from tests.integration.brokers import kafka_listener


@dataclasses.dataclass
class Backend:
    kind: str                        # "mq" (mq's Kafka listener) or "kafka" (the cluster)
    bootstrap: str
    socket: str | None = None        # mq's own socket, for the "mq" kind
    cluster: Any = None              # the KafkaCluster, for the "kafka" kind

    def name(self, what: str) -> str:
        """A topic, group or transactional id of this test's own."""
        return f"{what}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(params=["mq", "kafka"])
def backend(request, tmp_path):
    """mq's Kafka listener, then the Kafka cluster (see the module doc)."""
    if request.param == "mq":
        with kafka_listener(tmp_path) as (b, address):
            yield Backend("mq", address, socket=b.socket)
    else:
        cluster = request.getfixturevalue("kafka_cluster")
        yield Backend("kafka", cluster.bootstrap, cluster=cluster)
