#!/usr/bin/env bash
# The main job on the embedded default model: install, build, generate a few tokens, then
# serve the model over the OpenAI-compatible API on 127.0.0.1:8000 until interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
model=${PEERSERVE_MODEL:-models/peerserve-dsv3-tiny}
port=${PEERSERVE_PORT:-8000}
echo "== peerserve generate --model $model"
./build/apps/peerserve generate --model "$model" --prompt "The kernel" --max-tokens 24
echo
echo "== peerserve serve --model $model --port $port   (Ctrl-C to stop)"
echo "   try:  curl -s http://127.0.0.1:$port/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "           -d '{\"model\":\"$(basename "$model")\",\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}],\"max_tokens\":16}'"
exec ./build/apps/peerserve serve --model "$model" --port "$port"
