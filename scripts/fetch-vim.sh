#!/usr/bin/env bash
# Fetch Vim from Debian bookworm's `vim` source package and build it with
# clang-14 as ONE whole-program LLVM bitcode module, for `bunkai scatter`.
#
# Usage: scripts/fetch-vim.sh [DEST]      (default: build/third_party/vim)
#
# Produces in DEST:
#   vim.bc          every translation unit of the vim executable, llvm-link'ed
#   linkflags.txt   one line of libraries, so that
#                     clang-14 -O2 DEST/vim.bc $(cat DEST/linkflags.txt) -o vim
#                   gives a working vim
#   vim             that binary, built from vim.bc exactly as above (smoke test)
#   VERSION         Debian source version + build configuration
#   build.log       all build noise
#
# Idempotent: if the outputs exist and match this script's configuration it
# exits at once without touching apt or the network.
#
# How: configure with CC=clang-14 CFLAGS="-O2 -flto=full" so every object
# file is LLVM bitcode; the objects and libraries of vim's link line (make
# variables OBJ and ALL_LIBS) are llvm-link'ed / recorded.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/build/third_party/vim}"
mkdir -p "$DEST"
DEST="$(cd "$DEST" && pwd)"

# Bump when the build recipe changes, so an old DEST gets rebuilt.
RECIPE=2
FEATURES=huge
CONFIGURE_FLAGS=(
  --with-features="$FEATURES"
  --enable-gui=no --without-x --disable-xsmp --disable-xsmp-interact
  --disable-nls --disable-gpm --disable-sysmouse --disable-selinux
  --disable-smack --disable-acl --disable-canberra --disable-libsodium
  --disable-perlinterp --disable-pythoninterp --disable-python3interp
  --disable-rubyinterp --disable-luainterp --disable-tclinterp
  --disable-mzschemeinterp --disable-cscope --disable-netbeans
  --disable-icon-cache-update --disable-desktop-database-update
  --with-tlib=tinfo --with-compiledby=bunkai
)
CC_BIN=clang-14
BC_CFLAGS="-O2 -flto=full"
BC_LDFLAGS="-fuse-ld=lld -flto=full"

LOG="$DEST/build.log"
STAMP="recipe=$RECIPE features=$FEATURES cc=$CC_BIN cflags=$BC_CFLAGS configure=${CONFIGURE_FLAGS[*]}"

# ---------------------------------------------------------------- fast path
if [[ -s "$DEST/vim.bc" && -s "$DEST/linkflags.txt" && -s "$DEST/VERSION" ]] &&
   grep -qxF "$STAMP" "$DEST/VERSION"; then
  echo "fetch-vim: up to date in $DEST ($(head -n1 "$DEST/VERSION"))"
  exit 0
fi

START=$(date +%s)
rm -f "$DEST/vim.tmp.bc" "$DEST/vim.tmp" "$DEST/VERSION"
: >"$LOG"
log() { local t="[+$(($(date +%s) - START))s]"; echo "fetch-vim: $t $*"; echo "== $t $*" >>"$LOG"; }
fail() {
  echo "fetch-vim: FAILED: $*" >&2
  echo "---- last 40 lines of $LOG ----" >&2
  tail -n 40 "$LOG" >&2 || true
  exit 1
}
run() { "$@" >>"$LOG" 2>&1 || fail "$*"; }

SUDO=()
if [[ $(id -u) -ne 0 ]]; then SUDO=(sudo); fi

# ------------------------------------------------------------- tools + deps
APT_UPDATED=0
apt_update() {
  if [[ $APT_UPDATED -eq 0 ]]; then
    run "${SUDO[@]}" apt-get update -q
    APT_UPDATED=1
  fi
}
need_pkgs=()
for p in clang-14 lld-14 llvm-14 dpkg-dev make xz-utils libncurses-dev; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
    need_pkgs+=("$p")
  fi
done
if ((${#need_pkgs[@]})); then
  log "installing ${need_pkgs[*]}"
  apt_update
  run env DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${need_pkgs[@]}"
fi

# ------------------------------------------------------------------ source
SRCROOT="$DEST/src"
mkdir -p "$SRCROOT"
DSC="$(ls -1 "$SRCROOT"/vim_*.dsc 2>/dev/null | tail -n1 || true)"
if [[ -z "$DSC" ]]; then
  log "downloading Debian source package vim"
  cd "$SRCROOT"
  if ! apt-get source --download-only vim >>"$LOG" 2>&1; then
    # No deb-src entries (or their index was never fetched).
    if [ "$("${SUDO[@]}" bash "$ROOT/scripts/enable-deb-src.sh")" = added ]; then
      log "enabled deb-src (/etc/apt/sources.list.d/bunkai-deb-src.sources)"
    fi
    APT_UPDATED=0
    apt_update
    run apt-get source --download-only vim
  fi
  DSC="$(ls -1 "$SRCROOT"/vim_*.dsc | tail -n1)"
fi
DEBVER="$(sed -n 's/^Version: //p' "$DSC" | head -n1)"
UPVER="${DEBVER#*:}"; UPVER="${UPVER%-*}"
TREE="$SRCROOT/vim-$UPVER"

# Always build from a freshly unpacked (and Debian-patched) tree.
log "unpacking vim $DEBVER"
rm -rf "$TREE"
(cd "$SRCROOT" && dpkg-source --no-check -x "$(basename "$DSC")" "vim-$UPVER") >>"$LOG" 2>&1 ||
  fail "dpkg-source -x $DSC"

# ------------------------------------------------------------------- build
# Reproducible: vim's version.c uses __DATE__/__TIME__ unless configure sees
# SOURCE_DATE_EPOCH; take it from the Debian changelog.
SOURCE_DATE_EPOCH="$(cd "$TREE" && dpkg-parsechangelog -STimestamp 2>>"$LOG")" ||
  fail "dpkg-parsechangelog"
export SOURCE_DATE_EPOCH
cd "$TREE/src"
log "configure (CC=$CC_BIN CFLAGS=$BC_CFLAGS, features=$FEATURES)"
CC="$CC_BIN" CFLAGS="$BC_CFLAGS" LDFLAGS="$BC_LDFLAGS" \
  AR=llvm-ar-14 RANLIB=llvm-ranlib-14 \
  run ./configure "${CONFIGURE_FLAGS[@]}"

# Helper makefile, read after vim's own: it builds exactly the objects the
# `vim` target links ($(OBJ); version.o has no rule of its own, the vim
# recipe compiles it) without vim's final link, a whole-program LTO codegen
# we would only throw away, and it prints that link line's objects and libs.
cat >bunkai.mk <<'EOF'
bunkai-objects: auto/config.mk objects $(filter-out objects/version.o,$(OBJ)) version.c version.h
	$(CCC) version.c -o objects/version.o
bunkai-print-link:
	@echo $(OBJ) $(ALL_LIBS)
EOF
JOBS="$(nproc 2>/dev/null || echo 2)"
log "make -j$JOBS (objects only)"
run make -j"$JOBS" -f Makefile -f bunkai.mk bunkai-objects

# ------------------------------------------------------- whole-program .bc
LINK_LINE="$(make -s -f Makefile -f bunkai.mk bunkai-print-link 2>>"$LOG")" ||
  fail "make bunkai-print-link"
echo "link line: $LINK_LINE" >>"$LOG"
read -r -a LINK_WORDS <<<"$LINK_LINE"
OBJS=()
LIBS=()
for w in "${LINK_WORDS[@]}"; do
  case "$w" in
    *.o) OBJS+=("$w") ;;
    -l*|-pthread) LIBS+=("$w") ;;
  esac
done
((${#OBJS[@]} > 0)) || fail "no objects in vim's link line"
for o in "${OBJS[@]}"; do
  # LLVM bitcode magic is "BC\xC0\xDE"
  [[ "$(head -c 4 "$o" | od -An -tx1 | tr -d ' \n')" == "4243c0de" ]] ||
    fail "$o is not LLVM bitcode"
done
log "llvm-link-14 ${#OBJS[@]} bitcode objects -> vim.bc"
run llvm-link-14 "${OBJS[@]}" -o "$DEST/vim.tmp.bc"
run opt-14 -verify -disable-output "$DEST/vim.tmp.bc"
run llvm-dis-14 "$DEST/vim.tmp.bc" -o /dev/null
printf '%s\n' "${LIBS[*]}" >"$DEST/linkflags.txt"

# -------------------------------------------------------------- smoke test
log "smoke test: clang-14 -O2 vim.bc $(cat "$DEST/linkflags.txt")"
run "$CC_BIN" -O2 "$DEST/vim.tmp.bc" ${LIBS[@]+"${LIBS[@]}"} -o "$DEST/vim.tmp"
out="$(cd /tmp && "$DEST/vim.tmp" -u NONE -i NONE -N -n -es \
         -c "put ='bunkai-ok'" -c '%print' -c 'qa!' </dev/null 2>&1)" ||
  fail "vim built from vim.bc does not run"
grep -q bunkai-ok <<<"$out" || fail "vim built from vim.bc misbehaves: $out"
mv -f "$DEST/vim.tmp" "$DEST/vim"
mv -f "$DEST/vim.tmp.bc" "$DEST/vim.bc"

{
  echo "vim $DEBVER (Debian bookworm source package)"
  echo "$STAMP"
} >"$DEST/VERSION"

log "done in $(($(date +%s) - START))s: $DEST/vim.bc ($(du -h "$DEST/vim.bc" | cut -f1)), linkflags: $(cat "$DEST/linkflags.txt")"
