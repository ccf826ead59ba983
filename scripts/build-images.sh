#!/usr/bin/env bash
# Build the platform's images on a machine with no registry: a Debian base root filesystem made by
# mmdebstrap from Debian's packages and imported into dockerd, then the Dockerfile's targets.
#   scripts/build-images.sh [--trainer] [--engine] [--relock] [--cached]
# DOCKER_HOST picks the daemon. Built images are also saved under $ROLLOUT_IMAGE_CACHE (default
# /var/cache/rollout-platform), keyed by the content of what they are built from, and loaded from
# there the next time (a test's private dockerd starts empty). --cached: build nothing, exit 0 when every
# image asked for is in that cache (no daemon needed), 1 when one is not.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${ROLLOUT_IMAGE_CACHE:-/var/cache/rollout-platform}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
targets=(service)
relock=0
cached=0
for arg in "$@"; do
  case $arg in
    --trainer) targets+=(trainer) ;;
    --engine) targets+=(engine) ;;
    --relock) relock=1 ;;
    --cached) cached=1 ;;
    *) echo "usage: $0 [--trainer] [--engine] [--relock] [--cached]" >&2; exit 2 ;;
  esac
done
mkdir -p "$CACHE"

# 1. the base: Debian from Debian's packages (cached by suite and package list)
packages=$(grep -v '^#' deploy/base-packages.txt | paste -sd, -)
base_key=$(printf '%s %s' "$SUITE" "$packages" | sha256sum | cut -c1-16)
base_tar="$CACHE/base-$SUITE-$base_key.tar"
image_keys() {  # the dependencies' key (base + lock) and the targets' (deps + everything they are built from)
  deps_key=$( { echo "$base_key"; sha256sum deploy/service.lock deploy/deps.Dockerfile; } | sha256sum | cut -c1-16)
  content_key=$( { echo "$deps_key"; git ls-files -z -- Dockerfile pyproject.toml README.md services trainer_client \
    | xargs -0 sha256sum; } | sha256sum | cut -c1-16)
}
if [[ $cached == 1 ]]; then
  image_keys
  for saved in "$base_tar" "$CACHE/deps-$deps_key.tar" "${targets[@]/%/-$content_key.tar}"; do
    [[ -f $saved || -f $CACHE/$saved ]] || exit 1
  done
  exit 0
fi
# one build at a time into the cache (make test builds the images beside the tests; a compose test that
# starts first waits here, then loads what that build saved instead of building it a second time)
exec 9>"$CACHE/.build.lock"
flock 9
if [[ ! -f $base_tar ]]; then
  command -v mmdebstrap >/dev/null || { echo "mmdebstrap is needed: apt-get install mmdebstrap" >&2; exit 1; }
  echo "== base root filesystem: mmdebstrap $SUITE with $packages (a few minutes, once)"
  mmdebstrap --quiet --variant=apt --format=tar --include="$packages" --mode=root "$SUITE" "$base_tar.partial" "$MIRROR"
  mv "$base_tar.partial" "$base_tar"
  find "$CACHE" -name "base-*.tar" ! -name "$(basename "$base_tar")" -delete
fi
if [[ $(docker image inspect -f '{{index .Config.Labels "rollout.base"}}' "rollout-base:$SUITE" 2>/dev/null) != "$base_key" ]]; then
  echo "== importing rollout-base:$SUITE"
  docker import --change "LABEL rollout.base=$base_key" --change 'CMD ["/bin/bash"]' "$base_tar" "rollout-base:$SUITE" >/dev/null
fi

# 2. the pinned dependencies (cached by base + lock) and the targets (cached by the content of
# everything they are built from). The builder stages trust this host's CA bundle (networks that
# intercept TLS); the final images do not carry it.
cp "${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}" deploy/build-ca.crt
if [[ $relock == 1 ]]; then
  echo "== resolving .[e2b,docker] in the base image into deploy/service.lock"
  docker run --rm --network host -e PIP_CERT=/tmp/ca.crt -v "$PWD:/src:ro" -v "$PWD/deploy/build-ca.crt:/tmp/ca.crt:ro" \
    "rollout-base:$SUITE" bash -c 'python3 -m venv /tmp/v && cp -r /src /tmp/src && rm -rf /tmp/src/.venv &&
      /tmp/v/bin/pip install -q --disable-pip-version-check "/tmp/src[e2b,docker]" >&2 &&
      /tmp/v/bin/pip freeze --exclude-editable | grep -v "^rollout-platform"' > deploy/service.lock.new
  mv deploy/service.lock.new deploy/service.lock
  echo "== deploy/service.lock: $(wc -l < deploy/service.lock) pins"
fi
image_ok() {  # tag python-statement: the image's venv imports what it must (a build under heavy load has
  # produced an image whose venv layer was cut short: a third of site-packages and no platform code)
  docker run --rm --network none --entrypoint /opt/venv/bin/python "$1" -c "$2" >/dev/null 2>&1
}
load_or_build() {  # name tag key dockerfile target check
  local saved="$CACHE/$1-$3.tar"
  if [[ -f $saved ]]; then
    echo "== $2 from the cache"
    docker load -q -i "$saved" >/dev/null
    image_ok "$2" "$6" && return
    echo "== $2 from the cache is incomplete: building it again"
    rm -f "$saved"
  fi
  echo "== building $2"
  local attempt
  for attempt in 1 2 3; do  # a daemon under heavy load has lost a layer mid-build: try again
    docker build -q --network host -f "$4" ${5:+--target "$5"} --build-arg "BASE=rollout-base:$SUITE" \
      --build-arg DEPS=rollout-deps:latest -t "$2" . >/dev/null && image_ok "$2" "$6" && break
    [[ $attempt == 3 ]] && return 1
    echo "== building $2 failed or gave an incomplete image (attempt $attempt), retrying"
  done
  docker save -o "$saved.partial" "$2" && mv "$saved.partial" "$saved"
  find "$CACHE" -name "$1-*.tar" ! -name "$(basename "$saved")" -delete  # keep one of each
}
image_keys  # after a relock
load_or_build deps rollout-deps:latest "$deps_key" deploy/deps.Dockerfile "" "import fastapi, uvicorn, redis, aiohttp, pydantic, msgspec"
for target in "${targets[@]}"; do
  load_or_build "$target" "rollout-platform$([[ $target == service ]] || echo "-$target"):latest" "$content_key" Dockerfile "$target" \
    "import services.cli.main, trainer_client"
done
echo "== images: ${targets[*]} ($content_key)"
