#!/usr/bin/env bash
# bunkai flow microbenchmark: seed 003's Table 1 (§5.1) for the flow-ID
# runtime, with the paper's figures beside ours, baselines measured in the
# same runs and the targets of issue 7, written to bench/results/flow-micro.md;
# then weaving speed (flow-patch.md), Debian's memcached (flow-memcached.md),
# Apache (flow-apache.md), and the split driver's Tables 2 and 3
# (flow-splitdrv.md, flow-table3.md).
#   bench/flow/run.sh [--quick] [--runs N] [--runtime]
# --runtime: only the runtime's own figures (Table 1 and weaving speed), a
# few minutes; what to rerun after a change to flow/runtime/.
# Each run is a fresh process; a row's figure is the run whose mean is the
# median of the runs (the machine is shared: single runs wander). About a
# minute with the default 7 runs (--quick: 3 runs of 20 batches).
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=7
quick=()
runtime_only=
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick=(--quick); runs=3 ;;
    --runs) runs="$2"; shift ;;
    --runtime) runtime_only=1 ;;
    *) echo "bench/flow/run.sh: unknown option $1 (use --quick, --runs N or --runtime)" >&2; exit 2 ;;
  esac
  shift
done
make native >/dev/null
out=build/bench/flow
mkdir -p "$out" bench/results
cc=(clang-14 -O2 -g -Wall -Wextra -I flow/include bench/flow/micro.c)
"${cc[@]}" -o "$out/micro-so" -Lbuild/lib/bunkai -lbunkai-flow -Wl,-rpath,"$PWD/build/lib/bunkai" -lpthread -lm
"${cc[@]}" -o "$out/micro-a" build/lib/bunkai/libbunkai-flow.a -lpthread -lm

# The runtime's files go to a directory of ours (tmpfs, like /dev/shm).
tmp=$(mktemp -d /dev/shm/bunkai-flow-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export BUNKAI_FLOW_DIR="$tmp" BUNKAI_FLOW_IDS="$tmp/ids"
for i in $(seq "$runs"); do
  for v in so a; do
    "$out/micro-$v" "${quick[@]}" > "$out/run.$v.$i.tsv"
    BUNKAI_FLOW_POPULATE=1 "$out/micro-$v" "${quick[@]}" --store "bkf_store(3 values) populated" >> "$out/run.$v.$i.tsv"
    rm -f "$tmp"/bunkai-flow.*.buf
  done
  echo "run $i/$runs done" >&2
done
python3 bench/flow/report.py --runs "$runs" --dir "$out" --out bench/results/flow-micro.md ${quick:+--quick}
cat bench/results/flow-micro.md
# Weaving speed: bkf_weave/bkf_unweave of 100 to 2,000 sleds.
python3 bench/flow/patch.py --out bench/results/flow-patch.md
[ -z "$runtime_only" ] || exit 0
# The real server: Debian's memcached (make fetch-memcached), with memcaslap.
python3 bench/flow/memcached.py > /dev/null
# The paper's own server: Debian's apache2 (make fetch-apache), with ab.
python3 bench/flow/apache.py > /dev/null
# The split-driver case study (Table 2's shape), root only.
if [ "$(id -u)" = 0 ]; then
  python3 bench/flow/splitdrv.py > /dev/null
  python3 bench/flow/splitdrv.py --table3 > /dev/null
fi
