#!/usr/bin/env bash
# bunkai trace benchmarks, written to bench/results/:
#   trace-apache.md  the paper's Tables 1-6 and §4 on Debian's Apache (apache.py)
#   trace.md         recording speed against lackey, bytes per instruction,
#                    report throughput (speed.py)
#   bench/trace/run.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/../.."
quick=()
for a in "$@"; do
  case "$a" in
    --quick) quick=(--quick) ;;
    *) echo "bench/trace/run.sh: unknown option $a (use --quick)" >&2; exit 2 ;;
  esac
done
[ -x build/bin/bunkai ] || make
python3 bench/trace/apache.py
python3 bench/trace/speed.py "${quick[@]}"
