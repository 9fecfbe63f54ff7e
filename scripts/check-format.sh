#!/usr/bin/env bash
# The library tree (src/, include/, tools/) as .clang-format sets it: no line over its column
# limit, and, where clang-format 14 (Debian 12's) is installed, no file it would change.
# Exit 0 when the tree is clean, 1 with the files to fix (`clang-format -i FILE`), 77 when
# only the line limit could be checked (no clang-format: the test runner reports a skip).
#   scripts/check-format.sh [SOURCE_DIR]
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
limit=$(sed -n 's/^ColumnLimit: *//p' .clang-format)
mapfile -t files < <(git ls-files 'src/*.cc' 'src/*.h' 'include/*.h' 'tools/*.cc' 'tools/*.h' 2>/dev/null ||
                     find src include tools -name '*.cc' -o -name '*.h')
status=0
long=$(awk -v limit="$limit" 'length > limit {print FILENAME ":" FNR ": " length " columns"}' "${files[@]}")
if [[ -n $long ]]; then
  echo "lines over the column limit of $limit (.clang-format):"
  echo "$long"
  status=1
fi
format=$(command -v clang-format-14 || command -v clang-format || true)
if [[ -z $format ]] || ! "$format" --version | grep -q 'version 14\.'; then
  echo "check-format: clang-format 14 not found (apt install clang-format): checked the line limit only"
  [[ $status -eq 0 ]] && exit 77
  exit "$status"
fi
changed=()
for f in "${files[@]}"; do
  "$format" --dry-run --Werror "$f" >/dev/null 2>&1 || changed+=("$f")
done
if ((${#changed[@]} > 0)); then
  echo "files clang-format would change (run: $format -i FILE):"
  printf '  %s\n' "${changed[@]}"
  status=1
fi
exit "$status"
