#!/usr/bin/env bash
# Start the Docker engine sandbox-runtime uses when none answers: dockerd with our own config file (gVisor
# registered with no network and Docker's seccomp profile enforced inside its sandbox too), no default bridge
# network and no iptables (sandboxes never need one); its pid is in /var/run/docker.pid, its log in
# /var/log/sandbox-runtime-dockerd.log. Waits up to 60 s for the engine to answer. scripts/setup.sh calls this
# once docker.io is installed.
#
# A private engine beside it (the engine-restart tests start one of their own, so stopping it disturbs no one
# else's tests): set
#   SANDBOX_RUNTIME_DOCKERD_RUN_DIR   its socket (docker.sock: the engine is then asked there, as
#                                     DOCKER_HOST=unix://$SANDBOX_RUNTIME_DOCKERD_RUN_DIR/docker.sock), its pid file
#                                     (docker.pid) and its exec root (exec/, where its containerd's sockets live:
#                                     keep this path short, a unix socket's path is at most 107 bytes);
#   SANDBOX_RUNTIME_DOCKERD_DATA_DIR  its data root (data/: images, containers) and its log (dockerd.log); default:
#                                     the run dir.
# It gets the same config file and the same no-bridge, no-iptables flags, and a containerd of its own (dockerd's
# managed one, under its exec root; in a containerd namespace of its own even if a system containerd is used).
set -euo pipefail

log() { printf '[start-engine] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

run_dir="${SANDBOX_RUNTIME_DOCKERD_RUN_DIR:-}"
if [ -n "$run_dir" ]; then
  data_dir="${SANDBOX_RUNTIME_DOCKERD_DATA_DIR:-$run_dir}"
  pid_file="$run_dir/docker.pid" log_file="$data_dir/dockerd.log"
  export DOCKER_HOST="unix://$run_dir/docker.sock"
  where=(--host "$DOCKER_HOST" --pidfile "$pid_file" --exec-root "$run_dir/exec" --data-root "$data_dir/data"
    --containerd-namespace sandbox-runtime-private --containerd-plugins-namespace sandbox-runtime-private-plugins)
else
  pid_file=/var/run/docker.pid log_file=/var/log/sandbox-runtime-dockerd.log where=()
fi

engine_answers && exit 0
# our own engine gets its own config file, so /etc/docker/daemon.json (if any) is never touched; written only when
# it differs, and whole (renamed into place): a dockerd starting meanwhile never reads half of it
config='{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--oci-seccomp"]}}}'
if [ "$(cat /etc/sandbox-runtime/dockerd.json 2>/dev/null)" != "$config" ]; then
  as_root mkdir -p /etc/sandbox-runtime
  printf '%s\n' "$config" | as_root tee /etc/sandbox-runtime/dockerd.json.new >/dev/null
  as_root mv /etc/sandbox-runtime/dockerd.json.new /etc/sandbox-runtime/dockerd.json
fi
# the dockerd of our pid file runs (it may be one on its way out, just stopped, or one still starting)
dockerd_runs() {
  local pid
  pid=$(cat "$pid_file" 2>/dev/null) && [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ]
}
start_dockerd() {
  if [ -f "$pid_file" ]; then
    log "removing a stale $pid_file"
    as_root rm -f "$pid_file"
  fi
  log "starting dockerd (no default bridge, no iptables)${run_dir:+ on $DOCKER_HOST}"
  # in / (env -C): a daemon must not hold the folder it was started from (a clone that is removed later)
  as_root mkdir -p "$(dirname "$log_file")"
  as_root setsid nohup env -C / dockerd --config-file /etc/sandbox-runtime/dockerd.json --bridge=none --iptables=false \
    --ip6tables=false "${where[@]}" >>"$log_file" 2>&1 </dev/null &
}
# once the dockerd of our pid file is gone (a stopped one may take a while to end), ours starts; one that has not
# written its pid file 5 s after it was started has exited
started_at=0
for round in $(seq 1 120); do
  engine_answers && exit 0
  if ! dockerd_runs; then
    if [ "$started_at" -eq 0 ]; then
      start_dockerd
      started_at=$round
    elif [ $((round - started_at)) -ge 10 ]; then
      log "dockerd exited right after it started; see $log_file"
      exit 1
    fi
  fi
  sleep 0.5
done
log "the Docker engine did not answer within 60 s; see $log_file"
exit 1
