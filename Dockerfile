# One image for every service host (no torch: trainers install the [trainer] extra themselves).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap bash ca-certificates \
        slirp4netns nftables iproute2 e2fsprogs \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY services ./services
RUN pip install --no-cache-dir ".[e2b,docker]"
RUN useradd --uid 10001 --create-home rollout
ENTRYPOINT ["rollout"]
