#!/usr/bin/env bash
# Checks C++/CUDA files against the repository's .clang-format, or rewrites them.
#   scripts/format.sh [--check] [FILE...]   list the files clang-format would change (exit 1 if any)
#   scripts/format.sh --fix [FILE...]       rewrite those files in place
# Without FILEs: every tracked .h/.cpp/.cu/.cuh under src/, tests/, bench/ and tools/. Uses
# clang-format 14 (STYLE.md) when installed as clang-format-14, else `clang-format`, or the one
# $CLANG_FORMAT names. Formatting-only changes go in commits of their own.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"

mode=check
files=()
for arg in "$@"; do
  case "$arg" in
    --check) mode=check ;;
    --fix) mode=fix ;;
    -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "format.sh: unknown option \`$arg\`; expected --check, --fix or file names" >&2; exit 2 ;;
    *) files+=("$arg") ;;
  esac
done

tool="${CLANG_FORMAT:-}"
if [ -z "$tool" ]; then
  for candidate in clang-format-14 clang-format; do
    if command -v "$candidate" >/dev/null; then tool="$candidate"; break; fi
  done
fi
if [ -z "$tool" ] || ! command -v "$tool" >/dev/null; then
  echo "format.sh: clang-format not found${tool:+ (CLANG_FORMAT=$tool)}; install it with" >&2
  echo "  sudo apt-get install clang-format      (Debian 12 ships version 14, as STYLE.md asks)" >&2
  echo "or run scripts/setup.sh, or point CLANG_FORMAT at a clang-format 14 binary" >&2
  exit 2
fi
version="$("$tool" --version | sed -n 's/.*version \([0-9]*\).*/\1/p')"
if [ "$version" != "14" ]; then
  echo "format.sh: $tool is version ${version:-unknown}, not 14: other versions lay some lines out differently" >&2
fi

if [ ${#files[@]} -eq 0 ]; then
  cd "$root"
  mapfile -t files < <(git ls-files -- 'src/*.h' 'src/*.cpp' 'src/*.cu' 'src/*.cuh' 'tests/*.h' 'tests/*.cpp' \
    'tests/*.cu' 'tests/*.cuh' 'bench/*.h' 'bench/*.cpp' 'bench/*.cu' 'bench/*.cuh' 'tools/*.h' 'tools/*.cpp')
fi
for f in "${files[@]}"; do
  if [ ! -f "$f" ]; then echo "format.sh: \`$f\`: no such file" >&2; exit 2; fi
done

style="file:$root/.clang-format"
differ=()
for f in "${files[@]}"; do
  if ! "$tool" --style="$style" "$f" | cmp -s - "$f"; then differ+=("$f"); fi
done

if [ "$mode" = fix ]; then
  for f in "${differ[@]}"; do "$tool" --style="$style" -i "$f"; done
  echo "format.sh: rewrote ${#differ[@]} of ${#files[@]} files"
  exit 0
fi
for f in "${differ[@]}"; do echo "$f"; done
echo "format.sh: ${#differ[@]} of ${#files[@]} files differ from .clang-format (scripts/format.sh --fix FILE... rewrites them)" >&2
[ ${#differ[@]} -eq 0 ]
