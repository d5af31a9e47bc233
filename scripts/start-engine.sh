#!/usr/bin/env bash
# Start the Docker engine sandbox-runtime uses when none answers: dockerd with our own config file (gVisor
# registered with no network and Docker's seccomp profile enforced inside its sandbox too), no default bridge
# network and no iptables (sandboxes never need one); its pid is in /var/run/docker.pid, its log in
# /var/log/sandbox-runtime-dockerd.log. Waits up to 60 s for the engine to answer. scripts/setup.sh calls this
# once docker.io is installed; the engine-restart tests call it to start the engine again.
set -euo pipefail

log() { printf '[start-engine] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

engine_answers && exit 0
# our own engine gets its own config file, so /etc/docker/daemon.json (if any) is never touched
as_root mkdir -p /etc/sandbox-runtime
printf '%s\n' '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--oci-seccomp"]}}}' \
  | as_root tee /etc/sandbox-runtime/dockerd.json >/dev/null
start_dockerd() {
  if [ -f /var/run/docker.pid ]; then
    log "removing a stale /var/run/docker.pid"
    as_root rm -f /var/run/docker.pid
  fi
  log "starting dockerd (no default bridge, no iptables)"
  # in / (env -C): a daemon must not hold the folder it was started from (a clone that is removed later)
  as_root mkdir -p /var/log
  as_root setsid nohup env -C / dockerd --config-file /etc/sandbox-runtime/dockerd.json --bridge=none --iptables=false \
    >>/var/log/sandbox-runtime-dockerd.log 2>&1 </dev/null &
}
# a dockerd that does not answer may be one on its way out (just stopped): once it is gone, ours starts
started=0
for _ in $(seq 1 60); do
  engine_answers && exit 0
  if ! pgrep -x dockerd >/dev/null; then
    if [ "$started" -eq 1 ]; then
      log "dockerd exited right after it started; see /var/log/sandbox-runtime-dockerd.log"
      exit 1
    fi
    start_dockerd
    started=1
  fi
  sleep 1
done
log "the Docker engine did not answer within 60 s; see /var/log/sandbox-runtime-dockerd.log"
exit 1
