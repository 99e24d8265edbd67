#!/usr/bin/env bash
# Rebuild the minimum-versions venv from constraints-min.txt and run the unit suite in it: the run that holds
# pyproject.toml's lower bounds (tests/unit/test_packaging.py keeps them equal to constraints-min.txt's pins).
# Not a CI job (it would double CI's time); docs/dependencies.md records the last run.
# Usage: scripts/check_minimums.sh [VENV [PYTEST_ARGS...]]  (VENV default /tmp/venv-min, made anew; ~2.3 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-/tmp/venv-min}
shift $(( $# > 0 ? 1 : 0 ))  # the rest: extra pytest arguments
rm -rf "$VENV"
python3 -m venv "$VENV"
# torch first, at the CPU wheel that lies on disk (any other torch is a multi-GB download); then every pin.
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q -r constraints-min.txt
"$VENV/bin/pip" install -q --no-deps -e .
"$VENV/bin/pip" check
export RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH="$PWD"
start=$(date +%s)
"$VENV/bin/python" -m pytest -q -m "not slow" --timeout=1800 tests/unit -p no:cacheprovider "$@" || rc=$?
echo "unit suite at the minimums: $(( $(date +%s) - start )) s, exit ${rc:-0}"
exit "${rc:-0}"
