#!/usr/bin/env bash
# On a machine with a CUDA GPU and the [engine] extra: start a real SGLang engine through the
# platform (`rollout engine --mode sglang`), let it join a proxy's pool, send one call through
# the proxy, run one weight update from the same model directory, and stop everything.
#   scripts/gpu-engine-smoke.sh MODEL_DIR [TP_SIZE]
set -euo pipefail
MODEL=${1:?usage: $0 MODEL_DIR [TP_SIZE]}
TP=${2:-1}
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait; rm -rf "$WORK"' EXIT
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this script needs a CUDA GPU" >&2; exit 1; }
export ROLLOUT_ADMIN_TOKEN=${ROLLOUT_ADMIN_TOKEN:-$(python3 -c 'import secrets; print(secrets.token_hex(16))')}
rollout redis --port 16379 > "$WORK/redis.log" 2>&1 &
export ROLLOUT_REDIS_URL=redis://127.0.0.1:16379/0
rollout proxy --port 18100 > "$WORK/proxy.log" 2>&1 &
until curl -sf http://127.0.0.1:18100/healthz >/dev/null; do sleep 1; done
rollout engine --mode sglang --model-path "$MODEL" --port 30000 --tp-size "$TP" --context-length 8192 \
  --proxy-url http://127.0.0.1:18100 --pool gpu > "$WORK/engine.log" 2>&1 &
echo "== waiting for the SGLang engine to load and join pool gpu (log: $WORK/engine.log)"
until curl -sf -H "Authorization: Bearer $ROLLOUT_ADMIN_TOKEN" http://127.0.0.1:18100/admin/status \
  | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["pools"].get("gpu",{}).get("engines") else 1)'; do
  sleep 5
done
echo "== one call through the proxy"
curl -sf http://127.0.0.1:18100/generate -H 'Content-Type: application/json' -H 'X-Pool: gpu' \
  -d '{"text": "The capital of France is", "sampling_params": {"max_new_tokens": 16, "temperature": 0}, "return_logprob": true}'
echo
echo "== a weight update (same weights, version 1) through the proxy's transaction"
CHECKSUM=$(python3 -c "
from pathlib import Path; from services.protocol.weights import CHECKSUM_FILE, tree_checksum
files = sorted(p for p in Path('$MODEL').iterdir() if p.is_file() and p.name != CHECKSUM_FILE)
print(tree_checksum((p.name, [p.read_bytes()]) for p in files))")
curl -sf http://127.0.0.1:18100/admin/weights -H "Authorization: Bearer $ROLLOUT_ADMIN_TOKEN" \
  -H 'Content-Type: application/json' \
  -d "{\"pool\": \"gpu\", \"version\": \"1\", \"location\": \"$MODEL\", \"checksum\": \"$CHECKSUM\"}"
echo
