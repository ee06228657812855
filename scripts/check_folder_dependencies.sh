#!/usr/bin/env bash
# The library's folders include one another one way only (docs/COMPILER.md, "Folder
# dependencies"): each folder below may include the folders listed after it and no other. A
# folder inside another (jit/api inside jit) is a folder of its own: its parent may not include it.
# Prints every include that breaks the order, with its file and line, and fails if any does.
#   scripts/check_folder_dependencies.sh [SOURCE_ROOT]
set -euo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"

declare -A allowed=(
  [dsl]=""
  [comm]="dsl"
  [ir]="dsl"
  [partitioner]="dsl ir"
  [codegen]="dsl ir"
  [jit]="dsl comm ir partitioner codegen"
  [jit/api]="dsl comm ir partitioner codegen jit"
  [backend]="dsl comm ir codegen jit"
  [nn]="dsl jit jit/api"
  [plan]="dsl comm ir codegen jit jit/api nn"
)
folders="dsl comm ir partitioner codegen jit jit/api backend nn plan"  # lowest first

broken=0
for folder in $folders; do
  [[ -d "$root/$folder" ]] || { echo "no folder $folder/ under $root"; broken=1; continue; }
  # A folder's own files, not those of a folder inside it.
  nested_dirs=()
  for inner in $folders; do [[ "$inner" == "$folder"/* ]] && nested_dirs+=(--exclude-dir="${inner#"$folder"/}"); done
  while IFS= read -r hit; do
    # hit: FILE:LINE:#include "other/..."
    file="${hit%%:*}"
    rest="${hit#*:}"
    line="${rest%%:*}"
    other="$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$rest")"
    nested="$(sed -E 's/.*#include "([a-z_]+\/[a-z_]+)\/.*/\1/' <<<"$rest")"
    [[ "$nested" != "$rest" && " $folders " == *" $nested "* ]] && other="$nested"
    [[ "$other" == "$folder" ]] && continue
    [[ " $folders " == *" $other "* ]] || continue  # a system or third-party header
    if [[ " ${allowed[$folder]} " != *" $other "* ]]; then
      echo "${file#"$root"/}:$line: $folder/ includes $other/ (allowed: ${allowed[$folder]:-nothing})"
      broken=1
    fi
  done < <(grep -rnE '^#include "[a-z_]+/' "$root/$folder" "${nested_dirs[@]}" --include='*.cpp' --include='*.hpp' || true)
done
if ((broken)); then
  echo "folder dependencies: not one way (docs/COMPILER.md, \"Folder dependencies\")"
  exit 1
fi
echo "folder dependencies: one way ($folders)"
