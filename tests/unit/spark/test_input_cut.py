"""``spark_input_cut``: the exactly-once sink's look, just before a commit, at whether the JVM
feeding the task died (its connection reads as closed). Run in a fresh interpreter, so that no
socket left over by another test of this process speaks for it."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import socket
from mq.spark.writer import spark_input_cut
jvm, worker = socket.socketpair()
listening = socket.socket(); listening.bind(("127.0.0.1", 0)); listening.listen(1)
print(spark_input_cut())                 # open, nothing to read
jvm.sendall(b"\\xff\\xff\\xff\\xfc")      # END_OF_STREAM waiting to be read
print(spark_input_cut())
worker.recv(4)
jvm.close()                              # the JVM died
print(spark_input_cut())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
def test_a_closed_peer_is_seen_and_open_ones_are_not():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert out == ["False", "False", "True"]
