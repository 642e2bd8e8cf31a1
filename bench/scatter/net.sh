#!/usr/bin/env bash
# Scatter over a narrow network: the paper's Table 8 (seed 000, §6, §7.3),
# ours beside the paper's, written to bench/results/scatter-net.md.
#
#   bench/scatter/net.sh [--quick] [--bandwidths 100,500,1000]
#       [--workloads sqlite3-init,sqlite3-query,demo1,demo2,vim-init]
#       [--modes a,b,c,d,e] [--out FILE] [--work DIR]
#   bench/scatter/net.sh --merge A.md.json B.md.json [--out FILE]
#
# After each workload at each rate the table so far is written to --out
# (marked partial) with its raw state in OUT.json, so a run cut short keeps
# what it measured. Runs of different rates can go side by side (each with
# its own --work copy, as they group the programs themselves) and be
# rendered as one table with --merge.
#
# --quick: 1 Mbit/s only, sqlite3-init and demo1, one repetition (minutes).
# The full table takes well over an hour (at 100 kbit/s, downloading demo1
# alone takes ~12 minutes). Needs root (network namespaces, tc, mounts) and
# the packages of scripts/install-deps.sh (sshfs, openssh-server, curl,
# zstd, iproute2). See bench/scatter/net.py for what each mode measures.
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ "$(id -u)" != 0 ]; then
  echo "bench/scatter/net.sh: must run as root (network namespaces, tc, mounts)" >&2
  exit 1
fi
for tool in ip tc nsenter curl sshfs fusermount3 ssh-keygen zstd /usr/sbin/sshd; do
  if ! command -v "$tool" >/dev/null; then
    echo "bench/scatter/net.sh: $tool is missing; run scripts/install-deps.sh" >&2
    exit 1
  fi
done
[ -x build/bin/bunkai ] || make

# Which programs the selected workloads need (the default is all of them).
workloads=sqlite3-init,sqlite3-query,demo1,demo2,vim-init
quick=0 given= prev=
for a in "$@"; do
  case "$prev:$a" in
    *:--quick) quick=1 ;;
    --workloads:*) given=$a ;;
    *:--workloads=*) given=${a#--workloads=} ;;
  esac
  prev=$a
done
if [ -n "$given" ]; then workloads=$given; elif [ "$quick" = 1 ]; then workloads=sqlite3-init,demo1; fi
case ",$workloads," in
  *,sqlite3-*) bash scripts/fetch-sqlite.sh build/third_party/sqlite >&2 ;;
esac
case ",$workloads," in
  *,vim-init,*) bash scripts/fetch-vim.sh build/third_party/vim >&2 ;;
esac
exec python3 bench/scatter/net.py "$@"
