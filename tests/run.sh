#!/usr/bin/env bash
# Installs mq with its test extras, then runs the whole suite in parallel. Tests go to the
# workers a few at a time (--maxschedchunk), so the long ones collected first
# (tests/conftest.py: SLOW_FIRST) spread over every worker; the 25 slowest are listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
# One worker more than CPUs: about a third of the suite's time is spent waiting (JVMs and
# brokers starting, processes killed and restarted), which a third worker fills on 2 CPUs.
exec python3 -m pytest -n "$(($(nproc) + 1))" --maxschedchunk 4 --durations 25 "$@"
