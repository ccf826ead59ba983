# The service venv's dependencies, exactly as pinned in deploy/service.lock, without the platform's
# own code: built once per base + lock and cached (scripts/build-images.sh), so a code change
# rebuilds only the thin layer on top. The builder trusts the build host's CA bundle.
ARG BASE=rollout-base:bookworm
FROM ${BASE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CERT=/tmp/build-ca.crt
COPY deploy/build-ca.crt /tmp/build-ca.crt
COPY deploy/service.lock /tmp/service.lock
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir --no-deps -r /tmp/service.lock
