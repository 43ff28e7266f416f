#!/usr/bin/env bash
# Installs the Debian packages peerserve needs to build, test and benchmark.
# Idempotent: packages already present are not touched; safe to run on every build.
set -euo pipefail

packages=(
  build-essential cmake ninja-build g++ pkg-config
  clang libclang-rt-14-dev            # clang + its sanitizer and libFuzzer runtimes: the
                                      # sanitizer build and the fuzz targets of tests/fuzz
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libpcre2-dev
  libboost-dev                        # Asio + Beast (header-only) for the HTTP front end
  python3 python3-jinja2 python3-numpy python3-jsonschema  # independent references used by tests
  libdnnl-dev                         # optional: oneDNN comparison bench (docs/kernels.md)
  libopenmpi-dev openmpi-bin          # expert parallelism across processes (dist/)
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc  # cache server RPC
  libxxhash-dev                       # block checksums and the hash ring of the caching pool
  libssl-dev                          # SHA-256 of the prefix-cache block hashes (libcrypto)
  curl ca-certificates
  strace                              # durable_publish_test (sync order), ep_cli_test (slow load)
  iproute2                            # ep_two_hosts_test: two hosts as network namespaces
)
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)
if [[ "${PEERSERVE_WITH_TRAINING:-0}" == 1 ]]; then
  packages+=(python3-torch linux-doc-6.1 debian-reference-en fortunes)
  packages+=(libopenblas0-pthread)  # else Debian's torch runs on the reference BLAS (~1 GFLOP/s)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { echo "install-deps: run as root, or install sudo" >&2; exit 1; }
    SUDO=sudo
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
