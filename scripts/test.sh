#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh), runs the test suite, then executes every notebook (nbmake: a
# failing cell fails the run; 3 minutes per notebook at most). Extra arguments go to the first pytest.
# The tests run in one process per CPU core (pytest-xdist; the simulator is CPU-bound):
# PYTEST_WORKERS=0 runs them in this process. An idle worker takes queued tests from a busy one
# (worksteal). The notebooks run one at a time (in parallel they took twice as long on two cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
workers=${PYTEST_WORKERS:-auto}
.venv/bin/python -m pytest -q -n "$workers" --dist worksteal "$@"
.venv/bin/python -m pytest -q --nbmake --nbmake-timeout=180 notebooks
