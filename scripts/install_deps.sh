#!/usr/bin/env bash
# Installs the Debian 12 packages Tessera builds, tests and benchmarks with.
# Idempotent: packages already present are skipped, so re-running is cheap.
# Set TESSERA_INSTALL_PEERS=1 to also install the benchmark peers (libtorch, Eigen).
set -euo pipefail

packages=(
  build-essential meson ninja-build pkg-config cmake
  llvm-19-dev libopenmpi-dev openmpi-bin
  libfmt-dev doctest-dev libopenblas-dev libxsmm-dev zlib1g-dev libspdlog-dev
  libxxhash-dev nlohmann-json3-dev libcli11-dev libbenchmark-dev
  dataset-fashion-mnist fortunes gnuplot-nox
)
if [[ "${TESSERA_INSTALL_PEERS:-0}" == 1 ]]; then
  packages+=(libeigen3-dev libtorch-dev)
fi
# Set TESSERA_INSTALL_FUZZ=1 for clang 14 and its libFuzzer runtime (scripts/libfuzz.sh).
if [[ "${TESSERA_INSTALL_FUZZ:-0}" == 1 ]]; then
  packages+=(clang-14 libclang-rt-14-dev)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
echo "install_deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
