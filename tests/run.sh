#!/usr/bin/env bash
# Installs mq with its test extras, then runs the whole suite in parallel.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install --quiet --disable-pip-version-check -e ".[test]"
exec python3 -m pytest -n auto "$@"
