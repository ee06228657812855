#!/usr/bin/env bash
# Builds Tessera for the GPU machine and packs it into one self-contained tarball:
#   scripts/gpu_bundle.sh [outdir]          (default outdir: .gpu, ignored by git)
# gives <outdir>/tessera-gpu.tar.xz, which unpacks to tessera-gpu/:
#   bin/    the test programs (and their helpers cache_probe, checkpoint_writer), samples, benchmarks
#   lib/    libtessera.so (LLVM linked in statically) and the shared libraries everything needs,
#           except glibc and CUDA's own (libnvrtc, libcuda, libcublas, libnccl: the GPU machine's)
#   data/   Fashion-MNIST: the whole test split and the first $TESSERA_BUNDLE_TRAIN_IMAGES training images;
#           fortunes/: Debian's fortunes, the GPT sample's text (gpu_suite.sh's gpt step passes --data)
#   run.sh  run.sh PROGRAM [ARGS...]: finds the machine's CUDA libraries, sets LD_LIBRARY_PATH, runs
#           PROGRAM (a name in bin/ or a path) from a work directory, as `meson test` would
# The build is build-gpu/ (-Dllvm_static=true -Dnative_arch=false -Dcuda=enabled, release), made with
# ninja -j${TESSERA_JOBS:-2}; a second run only rebuilds what changed. See docs/GPU.md.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
outdir=${1:-.gpu}
build="build-gpu"
jobs=${TESSERA_JOBS:-2}
train_images=${TESSERA_BUNDLE_TRAIN_IMAGES:-4096}
name=tessera-gpu
stage=$build/bundle/$name

# The build's own packages (a fresh machine has none), then the bundle's: patchelf sets the
# RPATHs; llvm-config --link-static --system-libs asks for -lzstd (libzstd-dev).
scripts/install_deps.sh
missing=()
command -v patchelf > /dev/null || missing+=(patchelf)
dpkg-query -W -f='${Status}' libzstd-dev 2> /dev/null | grep -q "install ok installed" || missing+=(libzstd-dev)
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo="sudo"
  echo "gpu_bundle: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

options=(-Dnative_arch=false -Dllvm_static=true -Dbuildtype=release -Dcuda=enabled
         -Dsamples=true -Dbenchmarks=true -Dtests=true -Dbench_peers=disabled)
if [[ ! -f $build/build.ninja ]]; then
  meson setup "$build" --native-file scripts/native.ini "${options[@]}"
else
  meson setup --reconfigure "$build" --native-file scripts/native.ini "${options[@]}"
fi
start=$(date +%s)
ninja -C "$build" -j"$jobs"
echo "gpu_bundle: build took $(($(date +%s) - start)) s"

# ---- the tree ----
rm -rf "$stage"
mkdir -p "$stage"/{bin,lib,data}
is_elf_exe() { [[ -f $1 && -x $1 && $(head -c 4 "$1" | od -An -c | tr -d ' ') == '177ELF' ]]; }
programs=()
for dir in "$build"/test "$build"/samples "$build"/bench; do
  for f in "$dir"/*; do
    [[ $f == *.so || $f == *.a || $f == *.p ]] && continue
    is_elf_exe "$f" && programs+=("$f")
  done
done
cp "${programs[@]}" "$stage"/bin/
cp "$build"/libtessera.so "$stage"/lib/

# The shared-library closure (ldd is transitive), less glibc and what the GPU machine provides.
skip='^((linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libutil|libresolv)[-.]|libnvrtc|libnvJitLink|libcuda|libcublas|libnccl)'
deps=$(ldd "${programs[@]}" "$build"/libtessera.so)
if grep -q 'not found' <<< "$deps"; then
  grep 'not found' <<< "$deps" | sort -u
  echo "gpu_bundle: unresolved libraries (above)" >&2
  exit 1
fi
declare -A closure=()
while read -r soname _ path _; do
  [[ $path == /* ]] || continue
  [[ $soname =~ $skip || $soname == libtessera.so ]] && continue
  closure[$soname]=$path
done <<< "$deps"
for soname in "${!closure[@]}"; do cp -L "${closure[$soname]}" "$stage/lib/$soname"; done
if compgen -G "$stage/lib/libLLVM*" > /dev/null; then
  echo "gpu_bundle: libLLVM.so is still needed (is -Dllvm_static=true in effect?)" >&2
  exit 1
fi

chmod u+w "$stage"/bin/* "$stage"/lib/*
strip --strip-unneeded "$stage"/bin/* "$stage"/lib/*
# DT_RPATH (not RUNPATH) on the programs: it also serves the libraries' own dependencies, except
# those of a library with a RUNPATH of its own (libmpi and libopen-rte name Debian's openmpi/lib,
# libtessera the build's folders): theirs becomes $ORIGIN. So the programs run without run.sh too
# (given the machine's libnvrtc.so.13 in LD_LIBRARY_PATH or ld.so.conf).
# shellcheck disable=SC2016  # $ORIGIN is for the loader
for f in "$stage"/bin/*; do patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "$stage"/lib/*; do
  # shellcheck disable=SC2016
  [[ -z $(patchelf --print-rpath "$f") ]] || patchelf --force-rpath --set-rpath '$ORIGIN' "$f"
done

# Fashion-MNIST where Debian's dataset-fashion-mnist is installed: the test split whole, the training
# split cut to its first $train_images images (the header's count rewritten); the samples' short runs
# (meson test) train on at most 2048. The files are kept uncompressed (xz packs them 15% smaller than
# gzip did) under the loader's .gz names as links: read_idx reads plain files too.
mnist=/usr/share/datasets/fashion-mnist
if [[ -d $mnist ]]; then
  mkdir -p "$stage"/data/fashion-mnist
  python3 - "$mnist" "$stage"/data/fashion-mnist "$train_images" << 'EOF'
import gzip, os, struct, sys
src, dst, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
for split, n in (("t10k", None), ("train", limit)):
    for kind, item in (("images-idx3", 28 * 28), ("labels-idx1", 1)):
        name = f"{split}-{kind}-ubyte"
        data = gzip.open(f"{src}/{name}.gz").read()
        if n is not None:
            header = 4 + 4 * data[3]
            count = min(n, struct.unpack(">I", data[4:8])[0])
            data = data[:4] + struct.pack(">I", count) + data[8:header] + data[header:header + count * item]
        with open(f"{dst}/{name}", "wb") as f:
            f.write(data)
        os.symlink(name, f"{dst}/{name}.gz")
EOF
else
  echo "gpu_bundle: $mnist not found: the bundle has no Fashion-MNIST (the mnist samples will fail)" >&2
fi

# Debian's fortunes, the GPT sample's text (its --data; gpu_suite.sh's gpt step and
# bench/gpt_gpu_peers.py read data/fortunes): the plain files only, as TextCorpus reads a directory
# (regular files with no '.' in the name, not the .dat indices or .u8 links), 2.5 MB (0.8 MB in xz).
fortunes=/usr/share/games/fortunes
if [[ -d $fortunes ]]; then
  mkdir -p "$stage"/data/fortunes
  for f in "$fortunes"/*; do
    if [[ -f $f && ! -L $f && ${f##*/} != *.* ]]; then cp "$f" "$stage"/data/fortunes/; fi
  done
else
  echo "gpu_bundle: $fortunes not found: the bundle has no fortunes (the GPT sample will fail)" >&2
fi

# Where the tests look for their helpers and write reports (TESSERA_TEST_BUILD_DIR, compiled in).
test_build_dir=$(realpath "$build")/test
cat > "$stage"/BUILD_INFO << EOF
commit=$(git -C "$src" rev-parse HEAD)$(git -C "$src" diff --quiet HEAD -- . ':!docs' || echo "-dirty")
built=$(date -u +%Y-%m-%dT%H:%M:%SZ)
host=$(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)
test_build_dir=$test_build_dir
EOF

cat > "$stage"/run.sh << 'EOF'
#!/usr/bin/env bash
# run.sh PROGRAM [ARGS...]: runs a program of this bundle on the GPU machine. PROGRAM is a name in
# bin/ (test_ops) or a path. lib/ goes first in LD_LIBRARY_PATH; of the machine's libnvrtc.so.13,
# libcublas.so.13, libcublasLt.so.13, libnccl.so.2 and libcuda.so.1, those the loader does not find
# already (its cache, LD_LIBRARY_PATH) are looked for under the usual CUDA folders and pip's
# nvidia/*/lib, else anywhere, and their folders added after lib/ (kept in .cuda_libdirs).
# So that the tests find what they expect where they expect it, it also makes (when they are
# missing and it may): the build's test folder (compiled into the tests) holding links to
# bin/cache_probe and bin/checkpoint_writer, and /usr/share/datasets/fashion-mnist -> data/.
# TESSERA_BUNDLE_NO_LINKS=1 leaves both alone. The program runs in the build folder made so (as
# under `meson test`), else in work/ here.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if (($# == 0)); then
  echo "usage: $0 PROGRAM [ARGS...]   (programs: $(cd "$here"/bin && echo *))" >&2
  exit 2
fi

cache=$here/.cuda_libdirs
if [[ ! -e $cache ]]; then
  ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
  known=$("$ldconfig" -p 2> /dev/null || true)
  candidates=(/usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64
              /usr/local/cuda-*/targets/x86_64-linux/lib /usr/local/nvidia/lib64 /usr/local/nvidia/lib
              /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib /opt/conda/lib/python3*/site-packages/nvidia/*/lib
              /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/lib/python3*/dist-packages/nvidia/*/lib
              /usr/local/lib/python3*/site-packages/nvidia/*/lib "${HOME:-/root}"/.local/lib/python3*/site-packages/nvidia/*/lib)
  IFS=: read -ra search <<< "${LD_LIBRARY_PATH:-}"
  dirs=()
  for lib in libnvrtc.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcuda.so.1; do
    grep -qF "$(printf '\t')$lib " <<< "$known" && continue
    found=""
    for d in "${search[@]}" "${candidates[@]}"; do
      if [[ -n $d && -e $d/$lib ]]; then found=$d; break; fi
    done
    if [[ -z $found ]]; then
      found=$(find / \( -path /proc -o -path /sys -o -path /dev -o -path "$here" -o -name compat \) -prune -o \
              -name "$lib" -print 2> /dev/null | head -1 || true)
      found=${found%/*}
    fi
    if [[ -n $found ]]; then dirs+=("$found"); else echo "run.sh: $lib not found on this machine" >&2; fi
  done
  cuda_path=""
  if ((${#dirs[@]})); then cuda_path=$(printf '%s\n' "${dirs[@]}" | awk '!seen[$0]++' | paste -sd:); fi
  echo "$cuda_path" > "$cache" 2> /dev/null || true
else
  cuda_path=$(cat "$cache")
fi
export LD_LIBRARY_PATH="$here/lib${cuda_path:+:$cuda_path}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

program=$1
shift
if [[ $program != */* && -x $here/bin/$program ]]; then program=$here/bin/$program
elif [[ $program == */* ]]; then program=$(cd "$(dirname "$program")" && pwd)/$(basename "$program")
fi

workdir=$here/work
test_build_dir=$(sed -n 's/^test_build_dir=//p' "$here"/BUILD_INFO)
if [[ ${TESSERA_BUNDLE_NO_LINKS:-0} != 1 ]]; then
  if mkdir -p "$test_build_dir" 2> /dev/null && [[ -w $test_build_dir ]]; then
    for helper in cache_probe checkpoint_writer; do
      # Programs started side by side (gpu_suite.sh) race to make the link: whichever made it, it is there.
      [[ -e $test_build_dir/$helper ]] || ln -s "$here/bin/$helper" "$test_build_dir/$helper" 2> /dev/null ||
        [[ -e $test_build_dir/$helper ]] || echo "run.sh: cannot link $test_build_dir/$helper" >&2
    done
    workdir=${test_build_dir%/test}
  else
    echo "run.sh: cannot make $test_build_dir: three test cases need it (the disk cache, the killed save, the reports)" >&2
  fi
  mnist=/usr/share/datasets/fashion-mnist
  if [[ ! -e $mnist && -d $here/data/fashion-mnist ]]; then
    mkdir -p "${mnist%/*}" 2> /dev/null && ln -s "$here/data/fashion-mnist" "$mnist" 2> /dev/null || [[ -e $mnist ]] ||
      echo "run.sh: cannot link $mnist to $here/data/fashion-mnist: the mnist samples need it" >&2
  fi
fi
mkdir -p "$workdir"
cd "$workdir"
exec "$program" "$@"
EOF
chmod +x "$stage"/run.sh

# ---- the tarball ----
mkdir -p "$outdir"
tarball=$outdir/$name.tar.xz
# --x86: the branch filter for machine code (3% smaller); 9e: 2% smaller again, 70 s on two cores.
tar -C "$stage"/.. -cf - "$name" | xz -T2 --x86 --lzma2=preset=9e > "$tarball.tmp"
mv "$tarball.tmp" "$tarball"
raw=$(du -sb "$stage" | cut -f1)
packed=$(stat -c %s "$tarball")
echo "gpu_bundle: $tarball: $(numfmt --to=iec "$packed") compressed ($packed bytes), $(numfmt --to=iec "$raw") unpacked"
echo "gpu_bundle: on the GPU machine: tar -xJf $name.tar.xz -C /tmp && /tmp/$name/run.sh test_cuda_renderer"
