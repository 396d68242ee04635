#!/usr/bin/env bash
# The container image, built and run on this machine:
#
#   bash scripts/image_check.sh        (or: make image-check; .ci/run runs it after the tests)
#
# 1. a container engine: docker when its daemon answers, else podman (installed with apt
#    when this is root on Debian/Ubuntu and none is there; skipped, naming what is missing,
#    otherwise);
# 2. a Python base image: PYTHON_IMAGE when set (e.g. python:3.11-slim where a registry is
#    reachable), else localhost/sink-coordinator-base:bookworm, made once with debootstrap
#    (Debian's mirror, no image registry) and kept in the engine's storage for later runs;
# 3. `make image` with that base;
# 4. `python -m bench.image`: runs the image the way the chart does (read-only root, the
#    chart's user, `migrate` with the hook's environment, then `serve` against a real
#    PostgreSQL on 127.0.0.1 until /readyz answers, then SIGTERM within the chart's grace
#    period), and writes its size and start-to-ready time to bench/results/image.md.
#
# Exits non-zero on any failure; exits 0 with "image check SKIPPED: ..." when no engine can be had.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BASE_IMAGE=localhost/sink-coordinator-base:bookworm
IMAGE=${IMAGE:-localhost/sink-coordinator:check}
REPORT=${IMAGE_REPORT:-bench/results/image.md}
PYTHON=.venv/bin/python

log() { printf '==> %s\n' "$*"; }
skip() { printf 'image check SKIPPED: %s\n' "$*" >&2; exit 0; }

WORK=$(mktemp -d -t sink-coordinator-image-XXXXXX)
trap 'rm -rf "$WORK"' EXIT

can_install() { command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; }

apt_install() {
  log "installing $* with apt"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# podman's settings for a machine without systemd or cgroup delegation (containers, CI runners):
# runc, cgroupfs, events to a file, the limits pip and the coordinator need, the host's network
# (no CNI/netavark setup; the coordinator is told to bind 127.0.0.1).
podman_settings() {
  cat >"$WORK/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "host"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
  export CONTAINERS_CONF="$WORK/containers.conf"
}

choose_engine() {
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    ENGINE=docker
    return
  fi
  if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
    can_install || skip "no container engine: docker's daemon does not answer and podman (with runc) is not installed; install docker or podman, or run as root with apt"
    apt_install podman buildah runc
  fi
  ENGINE=podman
  podman_settings
}

has_image() { "$ENGINE" image inspect "$1" >/dev/null 2>&1; }

# A minimal Debian bookworm with python3 (3.11) and venv, imported as an image: no registry needed.
# The machine's CA bundle goes in, so that pip in the build reaches PyPI through a TLS-inspecting proxy.
make_base() {
  if has_image "$BASE_IMAGE"; then
    log "base image: cached $BASE_IMAGE"
    return
  fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    can_install || skip "no base image: $BASE_IMAGE is not built and debootstrap is not installed; set PYTHON_IMAGE=python:3.11-slim where a registry is reachable, or install debootstrap"
    apt_install debootstrap
  fi
  log "base image: debootstrap bookworm (a few minutes, once)"
  local root="$WORK/rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$root" \
    "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -20 "$WORK/debootstrap.log" >&2; exit 1; }
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  # Nothing in the image reads documentation, translations or apt's downloads.
  rm -rf "$root"/usr/share/{doc,man,info,locale}/* "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | "$ENGINE" import - "$BASE_IMAGE" >"$WORK/import.log" 2>&1 \
    || { cat "$WORK/import.log" >&2; exit 1; }
  log "base image: imported $BASE_IMAGE"
}

[[ -x "$PYTHON" ]] || make .venv/.installed
# The containers are run as the chart renders them: helm comes with the chart's check.
[[ -x .tools/bin/helm ]] || bash scripts/helm_check.sh
choose_engine
log "engine: $ENGINE"
if [[ -z "${PYTHON_IMAGE:-}" ]]; then
  make_base
  PYTHON_IMAGE=$BASE_IMAGE
fi

log "building $IMAGE on $PYTHON_IMAGE"
# Each run replaces the last one's image; podman keeps no intermediate images of its build (--layers=false),
# so runs leave nothing behind but the base and this image.
"$ENGINE" rmi --force "$IMAGE" >/dev/null 2>&1 || true
BUILD_ARGS="--network host"
[[ "$ENGINE" == podman ]] && BUILD_ARGS+=" --layers=false"
BUILD_STARTED=$(date +%s)
make --no-print-directory image ENGINE="$ENGINE" IMAGE="$IMAGE" PYTHON_IMAGE="$PYTHON_IMAGE" IMAGE_BUILD_ARGS="$BUILD_ARGS"
BUILD_SECONDS=$(($(date +%s) - BUILD_STARTED))

"$PYTHON" -m bench.image --engine "$ENGINE" --image "$IMAGE" --base "$PYTHON_IMAGE" \
  --build-seconds "$BUILD_SECONDS" --report "$REPORT"
