#!/usr/bin/env bash
# The VS Code end-to-end test: the packaged extension in a real VS Code
# (code-server 4.139.1 = VS Code 1.139.1), driven in Debian's Chromium: a trusted workspace
# (ui.mjs), then a folder opened untrusted, in Restricted Mode (restricted.mjs).
#
#   vscode-client/e2e/run.sh
#
# Environment:
#   OOM_E2E_CACHE      the install cache (default /tmp/oom-e2e-cache; reused when complete)
#   OOM_E2E_ARTIFACTS  screenshots, logs (default vscode-client/e2e/.work)
#   OOM_E2E_README_SHOTS  where the README's screenshots are written (default docs/images/editor)
#   OOM_E2E_PYTHON     the Python with oom-lsp installed (default .venv/bin/python)
#   OOM_E2E_PORT       code-server's port on 127.0.0.1 (default 18080; Restricted Mode's: the next one)
#   OOM_E2E_RUNS       which runs (default "trusted restricted ai")
# Exit status 0 when every check passed.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CLIENT="$(dirname "$HERE")"
REPO="$(dirname "$CLIENT")"
export OOM_E2E_CACHE="${OOM_E2E_CACHE:-/tmp/oom-e2e-cache}"
ARTIFACTS="${OOM_E2E_ARTIFACTS:-$HERE/.work}"
PYTHON="${OOM_E2E_PYTHON:-$REPO/.venv/bin/python}"
PORT="${OOM_E2E_PORT:-18080}"
README_SHOTS="${OOM_E2E_README_SHOTS:-$REPO/docs/images/editor}"
RUNS="${OOM_E2E_RUNS:-trusted restricted ai}"

"$HERE/install.sh"
NODE24="$OOM_E2E_CACHE/node24/node_modules/node/bin/node"
CODE_SERVER_ENTRY="$OOM_E2E_CACHE/code-server/node_modules/code-server/out/node/entry.js"

if [[ ! -f "$CLIENT/oom-lsp.vsix" || -n "$(find "$CLIENT/src" "$CLIENT/package.json" -newer "$CLIENT/oom-lsp.vsix" -print -quit)" ]]; then
  (cd "$CLIENT" && { [[ -d node_modules ]] || npm ci --no-audit --no-fund; } && npm run --silent package)
fi
"$PYTHON" -c "import oom_lsp" || { echo "e2e: $PYTHON cannot import oom_lsp (set OOM_E2E_PYTHON)" >&2; exit 1; }

# A fresh state, workspace copy and screenshot folder for every run.
rm -rf "$ARTIFACTS"
STATE="$ARTIFACTS/state"
WORKSPACE="$ARTIFACTS/workspace"
SCREENSHOTS="$ARTIFACTS/screenshots"
mkdir -p "$SCREENSHOTS" "$WORKSPACE/.vscode" "$WORKSPACE/fixtures" "$README_SHOTS"
cp "$HERE/workspace/train.py" "$HERE/workspace/mlp.py" "$HERE/workspace/classifier.py" \
  "$HERE/workspace/resume.ipynb" "$WORKSPACE/"
# The risky training scripts: every rule the fixtures trigger, whose messages must fit the Problems panel.
cp "$REPO"/fixtures/*_risky.py "$WORKSPACE/fixtures/"
# The what-if's fixture: a quick fix for each of its memory mistakes.
cp "$REPO/fixtures/estimate/whatif/risky_loop.py" "$WORKSPACE/"
# A CUDA OOM in train.py line 6, as a training run's log would show it.
cat > "$WORKSPACE/oom.log" <<EOF
Traceback (most recent call last):
  File "$WORKSPACE/train.py", line 6, in <module>
    state = torch.load("checkpoint.pt")
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 6.00 GiB total capacity; 5.00 GiB already allocated; 3.00 MiB free; 5.10 GiB reserved in total by PyTorch)
EOF
# Strict mode: the steps check findings the default level shows only where the size facts show
# the memory at stake (train.py's OOM501 and OOM101, the risky fixtures' advisory rules).
"$PYTHON" - "$WORKSPACE/.vscode/settings.json" "$PYTHON" "$ARTIFACTS/server.log" <<'EOF'
import json, sys
settings_file, python, log_file = sys.argv[1:]
json.dump({"oomLsp.interpreter": [python], "oomLsp.logFile": log_file, "oomLsp.trace.server": "messages",
           "oomLsp.extendSelect": ["OOM101"], "oomLsp.maxBatchSize": 256, "oomLsp.severity": {"OOM5": "error"},
           "oomLsp.gpu": "RTX 3090", "oomLsp.strict": True},
          open(settings_file, "w"), indent=2)
EOF
# As written, for the restricted run: the trusted run changes them (a missing interpreter, at its end).
cp "$WORKSPACE/.vscode/settings.json" "$ARTIFACTS/workspace-settings.json"
# Which server commands this checkout's server offers (some are newer than others).
SERVER_COMMANDS="$("$PYTHON" -c "from oom_lsp.server.features import create_server; print(' '.join(sorted(create_server().protocol.fm.commands)))")"
healthy() {  # port
  "$NODE24" -e "fetch('http://127.0.0.1:$1/healthz').then(r => process.exit(r.ok ? 0 : 1), () => process.exit(1))"
}
for port in "$PORT" "$((PORT + 1))" "$((PORT + 2))"; do
  if healthy "$port"; then
    echo "e2e: something already serves 127.0.0.1:$port; stop it or set OOM_E2E_PORT" >&2
    exit 1
  fi
done

CODE_SERVER_PID=
stop_code_server() {
  if [[ -n "$CODE_SERVER_PID" ]]; then
    kill -- "-$CODE_SERVER_PID" 2>/dev/null || true
    wait "$CODE_SERVER_PID" 2>/dev/null || true
    CODE_SERVER_PID=
  fi
}
trap stop_code_server EXIT

# code-server on 127.0.0.1:PORT with a state folder of its own (user settings from SETTINGS),
# the extension installed, serving WORKSPACE; the other arguments are code-server's.
start_code_server() {  # state settings port workspace [argument...]
  local state=$1 settings=$2 port=$3 workspace=$4
  shift 4
  mkdir -p "$state/data/User" "$state/extensions"
  cp "$settings" "$state/data/User/settings.json"
  # --config keeps code-server from writing a config file into the home folder.
  printf 'bind-addr: 127.0.0.1:%s\nauth: none\ncert: false\n' "$port" > "$state/config.yaml"
  local code_server=("$NODE24" "$CODE_SERVER_ENTRY" --config "$state/config.yaml"
    --user-data-dir "$state/data" --extensions-dir "$state/extensions")
  "${code_server[@]}" --install-extension "$CLIENT/oom-lsp.vsix" --force > "$state/install-extension.log" 2>&1
  # Its own process group, so that the extension host and the language server go with it.
  setsid "${code_server[@]}" --disable-telemetry --disable-update-check "$@" \
    --disable-getting-started-override --bind-addr "127.0.0.1:$port" --auth none "$workspace" \
    > "$state/code-server.log" 2>&1 &
  CODE_SERVER_PID=$!
  for _ in $(seq 120); do
    healthy "$port" && return 0
    kill -0 "$CODE_SERVER_PID" 2>/dev/null || { echo "e2e: code-server exited" >&2; cat "$state/code-server.log" >&2; exit 1; }
    sleep 0.5
  done
  echo "e2e: code-server did not answer on 127.0.0.1:$port" >&2
  exit 1
}

status=0
if [[ " $RUNS " == *" trusted "* ]]; then
  start_code_server "$STATE" "$HERE/user-settings.json" "$PORT" "$WORKSPACE" --disable-workspace-trust
  OOM_E2E_URL="http://127.0.0.1:$PORT/?folder=$WORKSPACE" \
  OOM_E2E_WORKSPACE="$WORKSPACE" \
  OOM_E2E_SCREENSHOTS="$SCREENSHOTS" \
  OOM_E2E_README_SHOTS="$README_SHOTS" \
  OOM_E2E_SERVER_COMMANDS="$SERVER_COMMANDS" \
  OOM_E2E_PLAYWRIGHT="$OOM_E2E_CACHE/playwright/node_modules/playwright-core" \
    "$NODE24" "$HERE/ui.mjs" || status=$?
  stop_code_server
fi

# Restricted Mode: a folder nobody trusted yet (a fresh state, workspace trust on, no startup
# prompt), with the trusted run's workspace settings. What Restricted Mode takes from user
# settings only (the interpreter, the log file) is in user settings here, as a user who opens
# untrusted folders has it.
RESTRICTED="$ARTIFACTS/restricted"
if [[ " $RUNS " == *" restricted "* ]]; then
  mkdir -p "$RESTRICTED/workspace/.vscode"
  cp "$HERE/workspace/train.py" "$REPO/fixtures/estimate/whatif/risky_loop.py" "$RESTRICTED/workspace/"
  cp "$ARTIFACTS/workspace-settings.json" "$RESTRICTED/workspace/.vscode/settings.json"
  "$PYTHON" - "$HERE/user-settings.json" "$RESTRICTED/user-settings.json" "$PYTHON" "$RESTRICTED/server.log" <<'EOF'
import json, sys
source, target, python, log_file = sys.argv[1:]
settings = json.load(open(source))
settings.update({"security.workspace.trust.enabled": True, "security.workspace.trust.startupPrompt": "never",
                 "oomLsp.interpreter": [python], "oomLsp.logFile": log_file})
json.dump(settings, open(target, "w"), indent=2)
EOF
  start_code_server "$RESTRICTED/state" "$RESTRICTED/user-settings.json" "$((PORT + 1))" "$RESTRICTED/workspace"
  OOM_E2E_URL="http://127.0.0.1:$((PORT + 1))/?folder=$RESTRICTED/workspace" \
  OOM_E2E_WORKSPACE="$RESTRICTED/workspace" \
  OOM_E2E_SCREENSHOTS="$SCREENSHOTS" \
  OOM_E2E_PLAYWRIGHT="$OOM_E2E_CACHE/playwright/node_modules/playwright-core" \
    "$NODE24" "$HERE/restricted.mjs" || status=$?
  stop_code_server
fi

# The AI fix (ai.mjs): the loopback model of tests/llm (fake_model.py), enabled in the workspace.
AI="$ARTIFACTS/ai"
MODEL_PID=
stop_model() {
  if [[ -n "$MODEL_PID" ]]; then
    kill "$MODEL_PID" 2>/dev/null || true
    wait "$MODEL_PID" 2>/dev/null || true
    MODEL_PID=
  fi
}
trap 'stop_code_server; stop_model' EXIT
if [[ " $RUNS " == *" ai "* ]]; then
  mkdir -p "$AI/workspace/.vscode"
  "$PYTHON" -c "import sys; sys.path.insert(0, sys.argv[2]); from tests.llm.conftest import TRAIN; open(sys.argv[1], 'w').write(TRAIN)" \
    "$AI/workspace/train_ai.py" "$REPO"
  printf '[project]\nname = "ai"\n' > "$AI/workspace/pyproject.toml"
  "$PYTHON" "$HERE/fake_model.py" "$AI/model-url" > "$AI/model.log" 2>&1 &
  MODEL_PID=$!
  for _ in $(seq 60); do [[ -s "$AI/model-url" ]] && break; sleep 0.5; done
  [[ -s "$AI/model-url" ]] || { echo "e2e: the loopback model did not start" >&2; cat "$AI/model.log" >&2; exit 1; }
  "$PYTHON" - "$HERE/user-settings.json" "$AI/user-settings.json" "$PYTHON" "$AI/server.log" "$(cat "$AI/model-url")" <<'EOF'
import json, sys
source, target, python, log_file, base_url = sys.argv[1:]
settings = json.load(open(source))
settings.update({"oomLsp.interpreter": [python], "oomLsp.logFile": log_file, "oomLsp.llm.enabled": True,
                 "oomLsp.llm.baseUrl": base_url, "oomLsp.llm.model": "test-model"})
json.dump(settings, open(target, "w"), indent=2)
EOF
  start_code_server "$AI/state" "$AI/user-settings.json" "$((PORT + 2))" "$AI/workspace" --disable-workspace-trust
  OOM_E2E_URL="http://127.0.0.1:$((PORT + 2))/?folder=$AI/workspace" \
  OOM_E2E_WORKSPACE="$AI/workspace" \
  OOM_E2E_SCREENSHOTS="$SCREENSHOTS" \
  OOM_E2E_PLAYWRIGHT="$OOM_E2E_CACHE/playwright/node_modules/playwright-core" \
    "$NODE24" "$HERE/ai.mjs" || status=$?
  stop_code_server
  stop_model
fi

# The server logged no error while the UI drove it.
for log in "$ARTIFACTS/server.log" "$RESTRICTED/server.log" "$AI/server.log"; do
  if [[ -f "$log" ]] && grep -E "^[0-9-]+ [0-9:,]+ ERROR " "$log"; then
    echo "e2e: the server logged errors ($log)" >&2
    status=1
  fi
done
echo "e2e: screenshots in $SCREENSHOTS, logs in $ARTIFACTS (exit $status)"
exit "$status"
