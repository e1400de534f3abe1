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

# pytest exits 5 when it collected no test: that is a failure for us too.
"$VENV/bin/python" -m pytest -p no:cacheprovider "$@"

# The memory budget gate on one fixture script, as a project's CI runs it (README, "Memory
# budget gate in CI"): fixtures/budget/pyproject.toml names the budget and the baseline; a
# predicted peak over the budget or 5% over the baseline fails CI. The script is named here, on
# the command line: a project's own estimate-scripts run only for a project the user trusts
# (docs/configuration.md#trust), and CI has no user configuration. A few seconds.
OOM_LSP="$(cd "$VENV" && pwd)/bin/oom-lsp"
(cd fixtures/budget && "$OOM_LSP" check --no-cache --estimate-script "train_mlp.py --epochs 2")
