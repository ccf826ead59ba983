# The platform's images, built without a registry (scripts/build-images.sh):
#   service  every service host (api, worker, proxy, broker, stand-in engines); no torch
#   trainer  training hosts: torch pinned (the CUDA build from PyPI on GPU hosts) + megatron-core
#   engine   GPU engine hosts: the service image + SGLang (`rollout engine --mode sglang`)
# BASE is a Debian root filesystem made with mmdebstrap from Debian's packages and imported into
# dockerd (scripts/build-images.sh does both; deploy/base-packages.txt lists what it holds: the
# local sandbox backend needs bubblewrap, slirp4netns, nftables, iproute2 and e2fsprogs).
# DEPS is the venv of every pinned dependency (deploy/deps.Dockerfile, from deploy/service.lock);
# the builder stages add the platform (and, for trainer/engine, their extras) and trust the build
# host's CA bundle (deploy/build-ca.crt, copied by the script: some networks intercept TLS); the
# final images get only the venv, neither that bundle nor the sources.
ARG BASE=rollout-base:bookworm
ARG DEPS=rollout-deps:latest

FROM ${DEPS} AS build
WORKDIR /src
COPY deploy/service.lock ./deploy/
COPY pyproject.toml README.md ./
COPY services ./services
COPY trainer_client ./trainer_client
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps ".[e2b,docker]" && /opt/venv/bin/pip check

FROM ${BASE} AS service
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1
# /data and /models are volume mount points: a new named volume takes their owner (uid 10001)
RUN useradd --uid 10001 --create-home rollout && mkdir -p /data /models && chown rollout:rollout /data /models
COPY --from=build /opt/venv /opt/venv
USER rollout
WORKDIR /home/rollout
ENTRYPOINT ["rollout"]

FROM build AS build-trainer
RUN /opt/venv/bin/pip install --no-cache-dir "torch==2.13.0" \
    && /opt/venv/bin/pip install --no-cache-dir -c deploy/service.lock ".[trainer,s3]"

FROM service AS trainer
COPY --from=build-trainer /opt/venv /opt/venv
ENTRYPOINT []
CMD ["rollout-train"]

FROM build AS build-engine
RUN /opt/venv/bin/pip install --no-cache-dir ".[engine,s3]"

FROM service AS engine
COPY --from=build-engine /opt/venv /opt/venv
