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
  # One awk over the folder's includes (a sed per line forked thousands of processes: 28 s, and
  # a test timeout on a loaded machine). hit: FILE:LINE:#include "other/..."; a nested folder
  # (jit/api) counts as its own when it is one of the folders.
  if ! grep -rnE '^#include "[a-z_]+/' "$root/$folder" "${nested_dirs[@]}" --include='*.cpp' --include='*.hpp' |
      awk -v folder="$folder" -v folders=" $folders " -v allowed=" ${allowed[$folder]} " -v root="$root/" '
        {
          split($0, parts, ":"); file = parts[1]; line = parts[2]
          if (!match($0, /#include "[a-z_]+\//)) next
          other = substr($0, RSTART + 10, RLENGTH - 11)
          if (match($0, /#include "[a-z_]+\/[a-z_]+\//)) {
            nested = substr($0, RSTART + 10, RLENGTH - 11)
            if (index(folders, " " nested " ")) other = nested
          }
          if (other == folder || !index(folders, " " other " ")) next  # its own, or a system or third-party header
          if (!index(allowed, " " other " ")) {
            sub("^" root, "", file)
            shown = allowed == "  " ? "nothing" : substr(allowed, 2, length(allowed) - 2)
            printf "%s:%s: %s/ includes %s/ (allowed: %s)\n", file, line, folder, other, shown
            bad = 1
          }
        }
        END { exit bad }'; then
    broken=1
  fi
done
if ((broken)); then
  echo "folder dependencies: not one way (docs/COMPILER.md, \"Folder dependencies\")"
  exit 1
fi
echo "folder dependencies: one way ($folders)"
