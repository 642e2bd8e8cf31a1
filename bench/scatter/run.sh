#!/usr/bin/env bash
# Scatter benchmark: the paper's Tables 3-5 (seed 000, §7.1), ours beside
# the paper's, written to bench/results/scatter.md.
#   bench/scatter/run.sh [--quick] [--no-vim]
set -euo pipefail
cd "$(dirname "$0")/../.."
quick=()
vim=1
for a in "$@"; do
  case "$a" in
    --quick) quick=(--quick) ;;
    --no-vim) vim=0 ;;
    *) echo "bench/scatter/run.sh: unknown option $a (use --quick, --no-vim)" >&2; exit 2 ;;
  esac
done
bash scripts/fetch-sqlite.sh build/third_party/sqlite
if [ "$vim" = 1 ] && [ -x scripts/fetch-vim.sh ]; then
  bash scripts/fetch-vim.sh build/third_party/vim
fi
exec python3 bench/scatter/tables.py "${quick[@]}"
