"""A handler module that imports in the supervisor but fails in every child (a database that
is not there yet, say): the pool's children crash at start, which is a crash loop."""

import os

if os.environ.get("MQ_WORKERS_SLOT") is not None:
    raise RuntimeError("cannot reach the database")


def handle(record):
    return None
