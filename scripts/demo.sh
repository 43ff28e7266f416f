#!/usr/bin/env bash
# The main job on the embedded default: install, build, and run peerserve on a model.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
echo "peerserve built: build/apps/peerserve --help"
./build/apps/peerserve --help
