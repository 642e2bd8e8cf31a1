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

NAME=fetch-memcached PKG=memcached MARKER=memcached.c BIN=memcached HELP=2,20 DEFAULT=memcached
check_deps() {
    [ -e /usr/include/event2/event.h ] || die "libevent-dev is missing (run scripts/install-deps.sh)"
}
version_of() { sed -n 's/^PACKAGE_VERSION=.\([0-9.]*\).*/\1/p' "$1/configure" | head -n 1; }
# In a copy of the source (cp -a keeps the time stamps, so make does not try
# to rerun autotools).
build_tree() {
    cp -a "$SRC" "$1" && cd "$1"
    ./configure CC="$2" CFLAGS="-O2 -g -gdwarf-4"
    make -j"$(nproc)" memcached
}
source "$(dirname "$0")/flow-server-build.sh"
flow_server_main "$@"
