#!/usr/bin/env bash
# Installs mq with its test extras, then runs the whole suite in parallel. Tests go to the
# workers a few at a time (--maxschedchunk), so the long ones collected first
# (tests/conftest.py: SLOW_FIRST) spread over every worker; the 25 slowest are listed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
exec python3 -m pytest -n auto --maxschedchunk 4 --durations 25 "$@"
