#!/usr/bin/env bash
# Fetch Debian bookworm's memcached source package and build it twice, for
# bunkai flow's real-server case study (issue 7, seed 003):
#   memcached-plain   clang-14 -O2 -g -gdwarf-4           (the baseline)
#   memcached-flow    bunkai flow cc -O2 -g -gdwarf-4     (join points + sleds)
# DWARF 4, because Valgrind 3.19 (bench/flow/memcached.py counts instructions
# with callgrind) gives up on clang-14's default DWARF 5.
#
# Usage: scripts/fetch-memcached.sh [DEST]    (default: build/third_party/memcached)
#
# Result in DEST: memcached-plain, memcached-flow, VERSION (upstream),
# DEBIAN_VERSION, fetch.log, and work/ (the unpacked source and both build
# trees). The configure line is Debian's without --enable-sasl and
# --enable-tls (neither is on the request path the case study follows, and
# they would need libsasl2 and a certificate).
#
# Idempotent: a rerun rebuilds only what is missing, and memcached-flow when
# the join-point pass is newer. --force rebuilds both.
# Needs: apt (root, for deb-src setup), dpkg-dev, make, libevent-dev,
# clang-14, and bunkai built (make).
set -euo pipefail

FORCE=0
DEST=""
for arg in "$@"; do
    case "$arg" in
        --force) FORCE=1 ;;
        -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "fetch-memcached: unknown option $arg (see --help)" >&2; exit 2 ;;
        *) [ -z "$DEST" ] || { echo "fetch-memcached: only one DEST allowed" >&2; exit 2; }
           DEST="$arg" ;;
    esac
done
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${DEST:-$ROOT/build/third_party/memcached}"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"
WORK="$DEST/work"
LOG="$DEST/fetch.log"
BUNKAI="$ROOT/build/bin/bunkai"
PASS="$ROOT/build/lib/bunkai/BunkaiFlow.so"

log() { echo "fetch-memcached: $*"; }
die() { echo "fetch-memcached: error: $*" >&2; exit 1; }

[ -x "$BUNKAI" ] && [ -e "$PASS" ] || die "bunkai is not built ($BUNKAI, $PASS) (run make first)"
command -v clang-14 >/dev/null || die "clang-14 not found (run scripts/install-deps.sh)"
[ -e /usr/include/event2/event.h ] || die "libevent-dev is missing (run scripts/install-deps.sh)"

# Up to date? The flow build also goes stale when the join-point pass changes.
# (Not the CLI: make reinstalls it on every build, and flow cc's driver
# part rarely changes; --force covers that.)
fresh_plain() { [ "$FORCE" = 0 ] && [ -x "$DEST/memcached-plain" ]; }
fresh_flow() { [ "$FORCE" = 0 ] && [ -x "$DEST/memcached-flow" ] && [ "$DEST/memcached-flow" -nt "$PASS" ]; }
if fresh_plain && fresh_flow; then
    exit 0
fi

# --- 1. the source package ------------------------------------------------
SRC="$WORK/src"
if [ ! -f "$SRC/memcached.c" ]; then
    log "apt-get source memcached"
    : >"$LOG"
    bash "$ROOT/scripts/debian-source.sh" memcached "$WORK" "$LOG" >"$DEST/DEBIAN_VERSION" || die "could not fetch the memcached source package"
    (cd "$SRC" && sed -n 's/^PACKAGE_VERSION=.\([0-9.]*\).*/\1/p' configure | head -n 1) >"$DEST/VERSION"
fi

# --- 2. two builds ----------------------------------------------------------
# cp -a keeps the time stamps, so make does not try to rerun autotools.
build() { # NAME CC
    local name="$1" cc="$2" tree="$WORK/build-$1"
    log "building memcached-$name (CC=$cc)"
    rm -rf "$tree" && cp -a "$SRC" "$tree"
    (
        cd "$tree"
        ./configure CC="$cc" CFLAGS="-O2 -g -gdwarf-4" >>"$LOG" 2>&1
        make -j"$(nproc)" memcached >>"$LOG" 2>&1
    ) || { tail -n 30 "$LOG" >&2; die "building memcached-$name failed (see $LOG)"; }
    install -m 755 "$tree/memcached" "$DEST/memcached-$name.tmp"
    mv "$DEST/memcached-$name.tmp" "$DEST/memcached-$name"
}
fresh_plain || build plain clang-14
fresh_flow || build flow "$BUNKAI flow cc"
log "memcached $(cat "$DEST/VERSION") (Debian $(cat "$DEST/DEBIAN_VERSION")): $DEST/memcached-plain, $DEST/memcached-flow"
