#!/usr/bin/env bash
# Set up everything the tests and benchmarks use, on top of what scripts/setup.sh sets up for the main job,
# idempotently:
#   1. scripts/setup.sh: the Docker engine, debootstrap and the quota tools, the package in .venv, the Docker image;
#   2. gVisor (runsc; the engine started by scripts/start-engine.sh already names it) and Podman's service (the
#      "podman" backend, which the tests run the conformance, containment and client suites on too), started
#      with no network by default when none answers;
#   3. LibreOffice (headless Calc, an independent reader of exported files), PostgreSQL's server programs (no
#      cluster: the tests start private ones) and Prometheus (its system service is never left running: the tests
#      start private ones);
#   4. the package's MCP and PostgreSQL extras and its development tools (pydantic-ai's MCP client too) in .venv;
#   5. real upstream MCP servers for the gateway tests, in .venv-upstream;
#   6. third-party MCP clients and servers for the interoperability tests: langchain-mcp-adapters in
#      .venv-langchain, the MCP Inspector CLI and server-everything (Node) in .npm-tools;
#   7. the executor image in Podman too.
# Safe to run again: each step does nothing when its work is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/setup-common.sh

apt_install runsc
# Podman, for the "podman" backend: its REST API service on its usual socket, with no network by default
# (recommends left out: its rootless helpers and network plugins are never used here)
podman_answers() { timeout 10 curl -sf --unix-socket /run/podman/podman.sock http://podman/_ping >/dev/null 2>&1; }
if ! podman_answers; then
  apt_install --no-install-recommends podman catatonit curl
  as_root bash scripts/start-podman.sh
fi
# LibreOffice (headless Calc) is the second, independent reader the tests open exported XLSX files with
apt_install libreoffice-calc-nogui
# PostgreSQL for the state-store tests, which start a private server of their own (tests/postgres_cluster.py):
# no system cluster is made or started. On a first install the postgresql-<version> package makes a "main" cluster
# unless /etc/postgresql-common/createcluster.conf says create_main_cluster = false (configure_version in
# postgresql-common's maintscripts-functions); a file written before postgresql-common is installed is kept (ucf
# keeps the local version when it cannot ask, and puts the package's own beside it as createcluster.conf.ucf-dist).
if ! dpkg -s postgresql >/dev/null 2>&1; then
  if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
    log "writing /etc/postgresql-common/createcluster.conf: no default PostgreSQL cluster"
    as_root mkdir -p /etc/postgresql-common
    printf '%s\n' "# written by sandbox-runtime's scripts/setup-dev.sh: its tests start their own PostgreSQL servers" \
      'create_main_cluster = false' | as_root tee /etc/postgresql-common/createcluster.conf >/dev/null
  fi
  apt_install postgresql
fi
# Prometheus for the metrics tests, which start a private server of their own on 127.0.0.1
# (tests/prometheus_server.py). Recommends left out (the node exporter). The package enables and starts a system
# service listening on :9090 on every interface: disabled and stopped at once under systemd, and stopped (by its
# init script's pid file, which only names that service) where an init script started it. Installed when its
# programs are missing (not when `dpkg -s` fails: a package removed but not purged still answers it).
if [ ! -x /usr/bin/prometheus ] || [ ! -x /usr/bin/promtool ]; then
  apt_update_once
  log "installing prometheus (its system service is disabled: the tests start their own servers)"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null
  if [ -d /run/systemd/system ]; then
    for unit in prometheus prometheus-node-exporter; do
      as_root systemctl disable --now "$unit" 2>/dev/null || true
    done
  elif [ -e /run/prometheus/prometheus.pid ]; then
    as_root update-rc.d prometheus disable >/dev/null 2>&1 || true
    as_root /etc/init.d/prometheus stop >/dev/null 2>&1 || true
  fi
fi

install_dev_extras() {
  .venv/bin/python -m pip install -q -e '.[dev,mcp]'
  touch .venv/.installed-dev
}
if ! .venv/bin/python -c 'import sandbox_runtime, mcp, pydantic_ai.mcp, psycopg_pool, pytest, xdist, ruff, mypy, mkdocs, material, inspect_ai, agents' >/dev/null 2>&1 \
   || [ pyproject.toml -nt .venv/.installed-dev ]; then
  log "installing sandbox-runtime's mcp and postgresql extras, its development tools, pydantic-ai-slim[mcp], inspect-ai and openai-agents into .venv"
  timed "installing into .venv" install_dev_extras
fi

# real upstream MCP servers the gateway tests stand in front of, in a venv of their own: they are built on the
# 1.x SDK (mcp-server-sqlite does not start on 2.x)
if [ ! -x .venv-upstream/bin/mcp-server-sqlite ] || [ ! -x .venv-upstream/bin/mcp-server-time ]; then
  log "installing upstream MCP servers (mcp-server-sqlite, mcp-server-time) into .venv-upstream"
  python3 -m venv .venv-upstream
  .venv-upstream/bin/python -m pip install -q "mcp<2" "mcp-server-sqlite==2025.4.25" "mcp-server-time==2025.9.25"
fi

# third-party MCP clients the interoperability tests drive `serve` with. langchain-mcp-adapters pins mcp<2, so
# it gets a venv of its own and talks to serve as a separate process, as its users do.
LANGCHAIN_REQUIREMENTS="langchain-mcp-adapters==0.3.2 langchain-core==1.8.3 mcp==1.30.0"
install_langchain_venv() {
  [ -x .venv-langchain/bin/python ] || python3 -m venv .venv-langchain
  # shellcheck disable=SC2086  # one requirement a word
  .venv-langchain/bin/python -m pip install -q $LANGCHAIN_REQUIREMENTS
  printf '%s\n' "$LANGCHAIN_REQUIREMENTS" >.venv-langchain/.installed
}
if [ "$(cat .venv-langchain/.installed 2>/dev/null)" != "$LANGCHAIN_REQUIREMENTS" ] \
   || ! .venv-langchain/bin/python -c 'import langchain_mcp_adapters.client, langchain_core' >/dev/null 2>&1; then
  log "installing $LANGCHAIN_REQUIREMENTS into .venv-langchain"
  timed "installing into .venv-langchain" install_langchain_venv
fi

# Node MCP tools from the npm registry, in .npm-tools (binaries in .npm-tools/node_modules/.bin/): the reference
# server-everything (images, annotations, resource links, progress, long operations) and the MCP Inspector,
# whose `mcp-inspector --cli TARGET --method tools/list|tools/call ...` is a scripted third-party client, and the
# TypeScript SDK itself (its 1.x client drives 2025-11-25 Tasks in the tests), and the 2026-07-28 generation: the
# TypeScript client 2.x with the Tasks extension's own client library (ext-tasks).
# Install scripts are skipped: the Inspector's only one installs its own source checkout's clients (a no-op here).
NPM_TOOLS="@modelcontextprotocol/server-everything@2026.8.31 @modelcontextprotocol/inspector@2.12.0 @modelcontextprotocol/sdk@1.32.2 @modelcontextprotocol/client@2.3.1 @modelcontextprotocol/ext-tasks@0.2.2"
install_npm_tools() {
  command -v npm >/dev/null || apt_install nodejs npm
  # shellcheck disable=SC2086  # one package a word
  npm install --prefix .npm-tools --save-exact --no-audit --no-fund --ignore-scripts --loglevel=error $NPM_TOOLS \
    >/dev/null
  printf '%s\n' "$NPM_TOOLS" >.npm-tools/.installed
}
if [ "$(cat .npm-tools/.installed 2>/dev/null)" != "$NPM_TOOLS" ] \
   || [ ! -x .npm-tools/node_modules/.bin/mcp-server-everything ] \
   || [ ! -x .npm-tools/node_modules/.bin/mcp-inspector ]; then
  log "installing $NPM_TOOLS into .npm-tools"
  timed "installing into .npm-tools" install_npm_tools
fi

.venv/bin/sandbox-runtime --policy podman image build
