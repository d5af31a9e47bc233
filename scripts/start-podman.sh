#!/usr/bin/env bash
# Start the Podman service sandbox-runtime's "podman" backend uses when none answers: `podman system service` on
# Podman's usual socket (/run/podman/podman.sock as root; $XDG_RUNTIME_DIR/podman/podman.sock rootless), with our
# own containers.conf (no network namespace by default, so nothing ever gets a bridge; ulimits a process with no
# capabilities may take). Its pid is in $run_dir/sandbox-runtime-podman.pid, its log in
# /var/log/sandbox-runtime-podman.log (rootless: beside the socket). Waits up to 30 s for the service to answer.
# scripts/setup-dev.sh calls this once podman is installed.
#
# A private service beside it (the service-restart test starts one of its own, so stopping it disturbs no one
# else's tests): set SANDBOX_RUNTIME_PODMAN_RUN_DIR to a folder; its socket is podman.sock there (keep the path
# short: a unix socket's path is at most 107 bytes; clients find it as CONTAINER_HOST=unix://<folder>/podman.sock),
# and its pid file, its log and its containers.conf (the same settings) are there too. It serves Podman's usual
# storage, as the usual service does: the API service holds no state of its own, each container runs under its own
# conmon.
set -euo pipefail

log() { printf '[start-podman] %s\n' "$*" >&2; }
if [ -n "${SANDBOX_RUNTIME_PODMAN_RUN_DIR:-}" ]; then
  run_dir=$SANDBOX_RUNTIME_PODMAN_RUN_DIR conf_dir=$SANDBOX_RUNTIME_PODMAN_RUN_DIR
  log_file="$run_dir/sandbox-runtime-podman.log"
elif [ "$(id -u)" -eq 0 ]; then
  run_dir=/run/podman conf_dir=/etc/sandbox-runtime log_file=/var/log/sandbox-runtime-podman.log
else
  run_dir="${XDG_RUNTIME_DIR:-/run/user/$(id -u)}/podman" conf_dir="$HOME/.config/sandbox-runtime"
  log_file="$run_dir/sandbox-runtime-podman.log"
fi
socket="$run_dir/podman.sock"
answers() { timeout 10 curl -sf --unix-socket "$socket" http://podman/_ping >/dev/null 2>&1; }

answers && exit 0
mkdir -p "$run_dir" "$conf_dir"
# our own containers.conf (CONTAINERS_CONF is read by this service only): /etc/containers is never touched
cat >"$conf_dir/containers.conf" <<'CONF'
[containers]
netns = "none"
default_ulimits = ["nofile=4096:4096", "nproc=1024:1024"]
log_driver = "k8s-file"
CONF
log "starting podman system service on $socket"
# in / (env -C): a service must not hold the folder it was started from (a clone that is removed later); and never
# as a client of another service (CONTAINER_HOST or CONTAINER_CONNECTION would make this podman a remote one)
rm -f "$socket"
CONTAINERS_CONF="$conf_dir/containers.conf" setsid nohup env -u CONTAINER_HOST -u CONTAINER_CONNECTION -C / \
  podman system service --time=0 "unix://$socket" >>"$log_file" 2>&1 </dev/null &
echo $! >"$run_dir/sandbox-runtime-podman.pid"
for _ in $(seq 1 60); do
  answers && exit 0
  if ! kill -0 "$(cat "$run_dir/sandbox-runtime-podman.pid")" 2>/dev/null; then
    log "the Podman service exited right after it started; see $log_file"
    exit 1
  fi
  sleep 0.5
done
log "the Podman service did not answer within 30 s; see $log_file"
exit 1
