#!/usr/bin/env bash
# Set up only what the main job (`sandbox-runtime doctor`, `demo`, the Python API) needs on a Debian/Ubuntu
# machine, idempotently:
#   1. a Docker engine: a working one (Docker Desktop, a system service) is left alone; otherwise the engine is
#      installed from the distribution's packages and started without a default bridge network (sandboxes never
#      need one);
#   2. the tools the runtime itself calls: debootstrap (the image's base, built offline), mkfs.ext4 and losetup
#      (each results folder's kernel-enforced disk quota);
#   3. the Python package, with no extras, in .venv (installed while step 1 runs);
#   4. the executor image in the engine the default policy uses, built offline when no container registry answers.
# scripts/setup-dev.sh adds everything the tests use (Podman, gVisor, PostgreSQL, Prometheus, LibreOffice, the
# MCP and PostgreSQL extras, the third-party clients and servers) on top of this.
# Safe to run again: each step does nothing when its work is already done.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup-common.sh

# the package installs while apt works: the two share nothing
venv_log=$(mktemp)
install_venv() {
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e .
  touch .venv/.installed
}
venv_pid=
if ! .venv/bin/python -c 'import sandbox_runtime' >/dev/null 2>&1 || [ pyproject.toml -nt .venv/.installed ]; then
  log "installing sandbox-runtime into .venv (in the background)"
  install_venv >"$venv_log" 2>&1 &
  venv_pid=$!
fi

if engine_answers; then
  log "a Docker engine answers: leaving it as it is"
else
  apt_install docker.io
  bash scripts/start-engine.sh
fi
apt_install debootstrap e2fsprogs mount

if [ -n "$venv_pid" ]; then
  if ! wait "$venv_pid"; then
    cat "$venv_log" >&2
    log "installing sandbox-runtime into .venv failed"
    exit 1
  fi
  log "sandbox-runtime is installed in .venv"
fi
rm -f "$venv_log"

.venv/bin/sandbox-runtime image build
