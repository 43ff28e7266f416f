#!/usr/bin/env bash
# Installs the JavaScript packages the tests use as independent references (the official
# OpenAI SDK, and the DeepSeek-V3 tokenizer port with its tokenizer.json) into
# tests/js/node_modules, from the versions pinned in tests/js/package-lock.json.
set -euo pipefail
cd "$(dirname "$0")/../tests/js"
if [[ -f package-lock.json ]]; then
  [[ -d node_modules ]] && npm ls --depth=0 >/dev/null 2>&1 && exit 0
  npm ci --no-audit --no-fund --loglevel=error
else
  npm install --no-audit --no-fund --loglevel=error
fi
