# Helpers scripts/setup.sh and scripts/setup-dev.sh share (sourced, not run).
log() { printf '[setup] %s\n' "$*" >&2; }
# timed WHAT COMMAND...: run a step's work and say how long it took
timed() {
  local what=$1 started=$SECONDS
  shift
  "$@"
  log "$what: done in $((SECONDS - started)) s"
}
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

apt_updated=0
apt_update_once() {
  [ "$apt_updated" -eq 1 ] && return 0
  as_root apt-get update -q >/dev/null
  apt_updated=1
}
# apt_install [--no-install-recommends] PACKAGE...: install the packages dpkg does not know yet
apt_install() {
  local options=() missing=()
  if [ "${1:-}" = "--no-install-recommends" ]; then options+=("$1"); shift; fi
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  apt_update_once
  log "installing ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${options[@]}" "${missing[@]}" >/dev/null
}

engine_answers() { timeout 10 docker info >/dev/null 2>&1; }
