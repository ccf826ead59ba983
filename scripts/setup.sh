#!/usr/bin/env bash
# All set-up on a fresh machine: system packages (as root, via apt), a virtual environment,
# the pinned CPU torch first (an unpinned torch pulls a multi-GB CUDA build), then the
# platform with every extra. Idempotent; `make` calls it when pyproject.toml changes.
set -euo pipefail
VENV=${1:-.venv}
cd "$(dirname "$0")/.."

# Sandboxes (bubblewrap), the Docker backend's tests (docker.io, busybox-static for a local
# image), network namespaces (iproute2), egress sandboxes (slirp4netns: user-space NAT; nftables:
# the rules inside their namespace), disk quotas (e2fsprogs: mkfs.ext4 for the loop-mounted images),
# the dashboard's browser test (chromium and its driver, driven by selenium; nothing downloads a
# browser build; fonts-dejavu-core for legible screenshots), the base image of the shipped SWE-style
# tasks (mmdebstrap).
SYSTEM_PACKAGES=(bubblewrap busybox-static docker.io iproute2 iptables slirp4netns nftables e2fsprogs btrfs-progs runsc
                 chromium chromium-driver fonts-dejavu-core mmdebstrap)
missing=()
for pkg in "${SYSTEM_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "== installing system packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "!! missing system packages: ${missing[*]} (install them with your package manager;" \
         "tests that need them will skip)" >&2
  fi
fi

PY=${PYTHON:-}
if [[ -z $PY ]]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null; then PY=$candidate; break; fi
  done
fi
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'

if [[ ! -x $VENV/bin/python ]]; then
  echo "== creating $VENV with $("$PY" --version)"
  "$PY" -m venv "$VENV"
fi
# --no-compile: pip byte-compiles every installed module on one core, about a minute here (torch's
# thousands of files most of it); Python compiles a module at its first import instead, only those that
# are imported. Where this environment forbids writing those caches (PYTHONDONTWRITEBYTECODE; `make`
# unsets it), every start would compile from source again: the venv is then compiled here, on every core.
# (uv, below, does not byte-compile either.)
PIP=("$VENV/bin/python" -m pip install -q --no-compile)
# Two distributions ship the module `connectrpc`: `connectrpc` (e2b's) and `connect-python`, the same project's
# older release under its former name, which verifiers' prime-sandboxes pulls. Whichever is written last wins, and
# connect-python's lacks what e2b imports. connectrpc's module serves both, so its files are written again last.
connectrpc_version() { "$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("connectrpc"))'; }

# Every step with one installer (``$@``: pip's or uv's install command; REINSTALL: its flag to write a
# package's files again). Each step's failure is returned: under ``if``, `set -e` does not stop a function.
install_all() {
  "$@" -U pip || return 1
  if ! command -v nvidia-smi >/dev/null; then
    # CPU machine: the CPU build of torch, from local disk where it is cached
    "$@" "torch==2.13.0" || return 1
  fi
  "$@" -e ".[all,dev]" || return 1
  "$@" "$REINSTALL" --no-deps "connectrpc==$(connectrpc_version)" || return 1
}

with_pip() { REINSTALL=--force-reinstall install_all "${PIP[@]}"; }

# uv (pip's interface, in Rust) installs the same requirements in 13 s with its cache warm (33 s cold) where
# pip took 50-78 s here. It reads none of pip's configuration: services/runtime/installer.py (the standard
# library only) hands pip's to it, as it does for agent bundles. Where uv cannot be installed or fails, pip
# does it all.
with_uv() {
  "${PIP[@]}" uv || return 1
  local args=(-q) line
  while IFS= read -r line; do  # services/runtime/installer.py: pip's configuration as uv's options
    case $line in
      --env=*) export "${line#--env=}" ;;
      *) args+=("$line") ;;
    esac
  done < <("$VENV/bin/python" -m services.runtime.installer "$VENV/bin/python")
  REINSTALL=--reinstall install_all "$VENV/bin/uv" pip install "${args[@]}"
}

if [[ -n ${ROLLOUT_SETUP_PIP:-} ]] || ! with_uv; then
  [[ -n ${ROLLOUT_SETUP_PIP:-} ]] || echo "== uv did not install the environment: pip does" >&2
  with_pip
fi
if [[ -n ${PYTHONDONTWRITEBYTECODE:-} ]]; then
  echo "== byte-compiling $VENV (PYTHONDONTWRITEBYTECODE is set)"
  "$VENV/bin/python" -m compileall -q -j 0 "$VENV/lib" >/dev/null || true
fi
"$VENV/bin/python" -c "import e2b, prime_sandboxes" || { echo "e2b and prime_sandboxes do not both import" >&2; exit 1; }
echo "== set-up done: $VENV"
