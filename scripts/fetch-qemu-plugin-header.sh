#!/usr/bin/env bash
# The plugin API header of QEMU 7.2 (include/qemu/qemu-plugin.h), which
# trace/qemu/ (the full-system recorder's TCG plugin) is built against:
# Debian bookworm's qemu-system-x86 is 7.2 and Debian ships no -dev package
# with the header, so it is taken from Debian's qemu source package, as the
# case studies take SQLite's and zlib's sources. Only the original tarball
# is downloaded (about 23 MB) and only that one file extracted.
#
# Usage: scripts/fetch-qemu-plugin-header.sh [DEST]
#   (default build/third_party/qemu-plugin; writes DEST/qemu-plugin.h and
#   DEST/VERSION). Idempotent: exits at once when the header is there.
# Needs: apt (root, for deb-src setup), xz-utils.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$ROOT/build/third_party/qemu-plugin}"
[ -s "$DEST/qemu-plugin.h" ] && exit 0
mkdir -p "$DEST"
WORK="$(mktemp -d "$DEST/.fetch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
LOG="$DEST/fetch.log"
bash "$ROOT/scripts/enable-deb-src.sh" | grep -q added && apt-get update -qq >>"$LOG" 2>&1 || true
(
    cd "$WORK"
    apt-get source --download-only -qq qemu && exit 0
    apt-get update -qq && apt-get source --download-only -qq qemu
) >>"$LOG" 2>&1 || { tail -n 20 "$LOG" >&2; echo "fetch-qemu-plugin-header: apt-get source qemu failed (is deb-src enabled? run scripts/install-deps.sh)" >&2; exit 1; }
ORIG="$(ls "$WORK"/qemu_*.orig.tar.xz | head -n 1)"
tar -xJf "$ORIG" -C "$WORK" --wildcards '*/include/qemu/qemu-plugin.h'
H="$(find "$WORK" -name qemu-plugin.h | head -n 1)"
grep -q 'QEMU_PLUGIN_VERSION 1' "$H" || { echo "fetch-qemu-plugin-header: $ORIG has a plugin API other than version 1 (QEMU 7.2 expected)" >&2; exit 1; }
basename "$ORIG" .orig.tar.xz | sed 's/^qemu_//' > "$DEST/VERSION"
mv "$H" "$DEST/qemu-plugin.h"
