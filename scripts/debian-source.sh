#!/usr/bin/env bash
# Fetch and unpack a Debian source package for the case studies' fetch
# scripts: the newest version first; a mirror may lack it (seen: a security
# update's files answering 404), so then each older version the package
# lists know, newest first. Debian's patches are applied (dpkg-source -x).
#
# Usage: scripts/debian-source.sh PACKAGE WORKDIR LOG
#   unpacks into WORKDIR/src (WORKDIR is emptied first), appends apt's and
#   dpkg-source's output to LOG, and prints the Debian version it got.
# Needs: apt (root, for deb-src setup), dpkg-dev.
set -euo pipefail
[ $# = 3 ] || { echo "debian-source: usage: debian-source.sh PACKAGE WORKDIR LOG" >&2; exit 2; }
PKG="$1" WORK="$2" LOG="$3"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
bash "$ROOT/scripts/enable-deb-src.sh" >/dev/null
rm -rf "$WORK" && mkdir -p "$WORK"
(
    cd "$WORK"
    apt-get source --download-only -qq "$PKG" && exit 0
    apt-get update -qq && apt-get source --download-only -qq "$PKG" && exit 0
    for v in $(apt-cache showsrc "$PKG" | sed -n 's/^Version: //p' | sort -rV | uniq); do
        rm -f "${PKG}"_*
        apt-get source --download-only -qq "$PKG=$v" && exit 0
    done
    exit 1
) >>"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; echo "debian-source: apt-get source $PKG failed (is deb-src enabled? run scripts/install-deps.sh)" >&2; exit 1; }
DSC="$(ls "$WORK/${PKG}"_*.dsc | head -n 1)"
(cd "$WORK" && dpkg-source -x "$DSC" src.tmp && mv src.tmp src) >>"$LOG" 2>&1 \
    || { tail -n 30 "$LOG" >&2; echo "debian-source: dpkg-source -x $DSC failed" >&2; exit 1; }
basename "$DSC" .dsc | sed "s/^${PKG}_//"
