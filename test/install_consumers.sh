#!/usr/bin/env bash
# Installs the build into a scratch prefix and builds test/consumer/app.cpp against it the two ways
# a user would: pkg-config, and a CMake project with find_package(Tessera). Each app must run and
# print the sum it computes.
#   test/install_consumers.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

meson install -C "$build" --no-rebuild --quiet --destdir "$stage/root"
prefix=$(meson introspect "$build" --buildoptions | python3 -c \
  'import json, sys; o = {x["name"]: x["value"] for x in json.load(sys.stdin)}; print(o["prefix"]); print(o["libdir"])')
libdir=$(sed -n 2p <<< "$prefix")
prefix=$stage/root$(sed -n 1p <<< "$prefix")
export LD_LIBRARY_PATH=$prefix/$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
expected="sum 36"

# pkg-config: the .pc file names the install prefix; the sysroot variable points it at the stage.
flags=$(PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$stage/root pkg-config --cflags --libs tessera)
# shellcheck disable=SC2086  # the flags are words
c++ -std=c++20 -O1 "$here/consumer/app.cpp" -o "$stage/app_pkgconfig" $flags
got=$("$stage/app_pkgconfig")
[[ $got == "$expected" ]] || { echo "pkg-config app printed '$got', expected '$expected'"; exit 1; }
echo "pkg-config: $got"

# CMake: find_package(Tessera) from the staged prefix.
cmake -S "$here/consumer" -B "$stage/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release > "$stage/cmake.log" \
  || { cat "$stage/cmake.log"; exit 1; }
cmake --build "$stage/cmake-build" > "$stage/cmake-build.log" 2>&1 || { cat "$stage/cmake-build.log"; exit 1; }
got=$("$stage/cmake-build/app")
[[ $got == "$expected" ]] || { echo "CMake app printed '$got', expected '$expected'"; exit 1; }
echo "CMake: $got"
