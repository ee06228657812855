#!/usr/bin/env bash
# Installs the Debian 12 packages Tessera builds, tests and benchmarks with.
# Idempotent: packages already present are skipped, so re-running is cheap.
# Set TESSERA_INSTALL_PEERS=1 to also install the benchmark peers (libtorch, Eigen).
set -euo pipefail

packages=(
  build-essential meson ninja-build pkg-config cmake
  llvm-19-dev libopenmpi-dev openmpi-bin
  libfmt-dev doctest-dev libopenblas-dev libxsmm-dev zlib1g-dev libspdlog-dev
  libxxhash-dev nlohmann-json3-dev libcli11-dev libbenchmark-dev libjemalloc-dev
  dataset-fashion-mnist fortunes gnuplot-nox
)
if [[ "${TESSERA_INSTALL_PEERS:-0}" == 1 ]]; then
  packages+=(libeigen3-dev libtorch-dev)
fi
# NVRTC (CUDA 11.8's, which targets sm_90) from Debian's non-free component: the suite compiles
# every CUDA kernel it generates, on machines with no GPU (backend/cuda/nvrtc_library.hpp).
# TESSERA_INSTALL_NVRTC=0 leaves it out (those test cases then report skipped).
if [[ "${TESSERA_INSTALL_NVRTC:-1}" == 1 ]]; then
  packages+=(libnvrtc11.2)
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

# Adds the non-free component to the machine's existing Debian entries (the deb822 stanzas whose
# Suites name "bookworm"), leaving their archive and every other entry as they are.
enable_non_free() {
  local sources=/etc/apt/sources.list.d/debian.sources
  if [[ -f $sources ]]; then
    local edited
    edited=$(awk -f - "$sources" <<'AWK'
BEGIN { RS = "" }
{
  n = split($0, line, "\n"); debian = 0
  for (i = 1; i <= n; i++)
    if (line[i] ~ /^Suites:/) { m = split(line[i], word, /[ \t]+/); for (j = 2; j <= m; j++) if (word[j] == "bookworm") debian = 1 }
  for (i = 1; i <= n; i++) {
    if (debian && line[i] ~ /^Components:/ && line[i] !~ /[ \t]non-free([ \t]|$)/) line[i] = line[i] " non-free"
    printf "%s%s", line[i], (i < n ? "\n" : "")
  }
  printf "\n\n"
}
AWK
)
    [[ "$edited" == "$(cat "$sources")" ]] || printf '%s\n' "$edited" | $sudo tee "$sources" > /dev/null
  elif [[ -f /etc/apt/sources.list ]]; then  # the one-line format
    $sudo sed -i -E '/^deb .* bookworm( |$)/ { / non-free( |$)/! s/$/ non-free/ }' /etc/apt/sources.list
  fi
}
echo "install_deps: installing ${missing[*]}"
[[ " ${missing[*]} " != *" libnvrtc11.2 "* ]] || enable_non_free
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
