#!/usr/bin/env bash
# bunkai mod: 100,000 module mutants against one running host
# (tests/e2e/mod_mutants.rs with a larger count), written to
# bench/results/mod-mutants.md. Target: 0 host crashes, 0 panics, every
# refusal one line. About 40 minutes on a quiet 2-core machine.
#   bench/mod/mutants.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${1:-100000}"
[ -x build/bin/bunkai ] || make
mkdir -p bench/results
BUNKAI="${BUNKAI:-$PWD/build/bin/bunkai}" BUNKAI_ROOT="$PWD" BUNKAI_MOD_MUTANTS="$n" \
  BUNKAI_MOD_MUTANTS_REPORT="$PWD/bench/results/mod-mutants.md" \
  cargo test --release -p bunkai-e2e --test mod_mutants -- --nocapture
cat bench/results/mod-mutants.md
