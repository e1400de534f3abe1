#!/usr/bin/env bash
# Set up a virtual environment from scratch and run the whole test suite.
# Used by the README's second command and by CI (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${OOM_LSP_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# torch first, pinned: the CPU wheel that the estimate/profile tests need.
# An unpinned torch would pull gigabytes of CUDA builds.
"$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
"$VENV/bin/python" -m pip install --quiet -e ".[test]"

# The VS Code extension: type check, unit tests (they also write the settings
# fixture that tests/server/test_vscode_init_options.py replays), bundle, .vsix.
if command -v npm >/dev/null 2>&1; then
    (cd vscode-client && npm ci --no-audit --no-fund --loglevel=error && npm run --silent check \
        && npm test --silent && npm run --silent package)
else
    echo "scripts/test.sh: npm not found: skipping the VS Code extension's build and tests (needs Node 20)" >&2
fi

# Two passes. Most tests wait on subprocesses (servers, fake-tensor traces), so they run on
# pytest-xdist workers, one per core (at most 4: each worker starts torch processes); a file's
# tests stay on one worker (--dist loadfile), so its module-scoped servers start once. Tests
# marked `serial` (signals on a running script, counts of the processes it left) are
# timing-sensitive under load: they run afterwards, alone. OOM_LSP_TEST_WORKERS=0 runs the
# first pass in this process, without workers.
WORKERS="${OOM_LSP_TEST_WORKERS:-$(nproc 2>/dev/null || echo 2)}"
if [ "$WORKERS" -gt 4 ]; then WORKERS=4; fi
PARALLEL=(-n "$WORKERS" --dist loadfile)
if [ "$WORKERS" -le 1 ]; then PARALLEL=(-p no:xdist); fi
# pytest exits 5 when it collected no test: one pass may select none (a path with no serial
# test), but not both.
status=0
"$VENV/bin/python" -m pytest -p no:cacheprovider "${PARALLEL[@]}" -m "not serial" "$@" || status=$?
serial_status=0
"$VENV/bin/python" -m pytest -p no:cacheprovider -m serial "$@" || serial_status=$?
if [ "$status" -eq 5 ] && [ "$serial_status" -eq 5 ]; then
    echo "scripts/test.sh: no test ran" >&2
    exit 5
fi
for code in "$status" "$serial_status"; do
    if [ "$code" -ne 0 ] && [ "$code" -ne 5 ]; then exit "$code"; fi
done

# The memory budget gate on one fixture script, as a project's CI runs it (README, "Memory
# budget gate in CI"): fixtures/budget/pyproject.toml names the budget and the baseline; a
# predicted peak over the budget or 5% over the baseline fails CI. The script is named here, on
# the command line: a project's own estimate-scripts run only for a project the user trusts
# (docs/configuration.md#trust), and CI has no user configuration. A few seconds.
OOM_LSP="$(cd "$VENV" && pwd)/bin/oom-lsp"
(cd fixtures/budget && "$OOM_LSP" check --no-cache --estimate-script "train_mlp.py --epochs 2")
