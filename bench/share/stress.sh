#!/usr/bin/env bash
# bunkai share: correctness under repetition (bench/share/stress.py): 200
# runs each of lbzip2 -n 3 and pigz -p 3 (compress and decompress), the
# litmus tests (at least 100,000 iterations each), the memory stress, the
# dlopen program, first touches racing on a node (firsttouch.c) and Python
# threads, across three hosts; every run checked.
#   bench/share/stress.sh [--quick] [--runs N]
# Needs root. Takes 90-107 minutes here (--quick: about 4).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/bin/bunkai ] || make
exec python3 bench/share/stress.py "$@"
