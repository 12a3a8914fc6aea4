#!/usr/bin/env bash
# Sets up .venv (scripts/setup.sh), runs the test suite, then executes every notebook (nbmake: a
# failing cell fails the run; 3 minutes per notebook at most). Extra arguments go to the first pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/python -m pytest -q "$@"
.venv/bin/python -m pytest -q --nbmake --nbmake-timeout=180 notebooks
