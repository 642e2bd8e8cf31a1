#!/usr/bin/env bash
# bunkai share benchmark: seed 002's Table 1 and Figure 9, page transfer
# latency and real programs (pigz, xz, zstd) across three hosts (network
# namespaces), written to bench/results/share.md (+ share-fig9.svg).
#   bench/share/run.sh [--quick]
# Needs root (namespaces, userfaultfd) and the packages of
# scripts/install-deps.sh. Takes about 10 minutes (--quick: about 3).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x build/bin/bunkai ] || make
exec python3 bench/share/run.py "$@"
