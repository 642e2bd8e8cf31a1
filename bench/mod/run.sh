#!/usr/bin/env bash
# bunkai mod benchmark: DKM's Table 1, measurement 2 (Figures 2-3, equations
# (1)-(3)), the load-time model's prediction error, and dlopen beside ours,
# written to bench/results/mod.md (and the JSON to bench/results/mod.json).
#   bench/mod/run.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/../.."
quick=()
for a in "$@"; do
  case "$a" in
    --quick) quick=(--quick) ;;
    *) echo "bench/mod/run.sh: unknown option $a (use --quick)" >&2; exit 2 ;;
  esac
done
mkdir -p bench/results
build/bin/bunkai mod bench "${quick[@]}" --json --markdown bench/results/mod.md > bench/results/mod.json.tmp
mv bench/results/mod.json.tmp bench/results/mod.json
cat bench/results/mod.md
