#!/usr/bin/env bash
# Installs everything bunkai needs on Debian bookworm, with apt only.
# Idempotent: safe to rerun; it installs only what is missing and enables
# deb-src (for `apt-get source`) only once.
set -euo pipefail

if [ "$(id -u)" != 0 ]; then
  echo "install-deps: run as root (apt-get needs it)" >&2
  exit 1
fi

PKGS=(
  clang-14 lld-14 llvm-14 llvm-14-dev liblld-14-dev  # scatter: passes, codegen, in-process lld
  libzstd-dev libcurl4-openssl-dev zlib1g-dev        # scatter's network runtime; lld needs zlib
  libssl-dev                                         # SHA-256 of downloaded groups (libcrypto)
  sshfs openssh-server openssh-client                # Table 8 mode (b): the original over SSHFS
  valgrind gcc libc6-dev                             # trace: the Valgrind tool API; the tool is built with gcc, as Valgrind is
  apache2-bin                                        # trace case study: Apache httpd (run by hand, -X, loopback only)
  qemu-system-x86 linux-image-amd64 busybox-static cpio # trace's full-system guest: QEMU's TCG, Debian's kernel, the initramfs of trace/guest
  iproute2 iputils-ping                              # network namespaces for share/scatter tests and benches
  pigz lbzip2 xz-utils zstd strace                   # share: real multithreaded programs from Debian (pigz -p 3, lbzip2 -n 3, xz -T3); pigz also runs on scatter --lib's zlib
  binutils                                           # readelf: the scatter --lib test compares exported symbols and versions
  libsqlite3-0 libssl3 liblzma5                      # share: libraries its tests dlopen from threads on other hosts
  cmake ninja-build make pkg-config                  # build of the C/C++ parts
  dpkg-dev tcl                                       # apt-get source, make deb (dpkg-shlibdeps); SQLite's amalgamation needs tclsh
  libevent-dev libmemcached-tools                    # flow case study: memcached from source (libevent), memcaslap load
  libapr1-dev libaprutil1-dev libpcre2-dev apache2-utils # flow Table 3 on Apache from source (APR, PCRE2), ab load
  fonts-dejavu-core                                  # DejaVu Sans, embedded in bunkai for the labels of its pictures (plotters)
  python3-matplotlib                                 # the benchmarks' figures (bench/share/fig9.py)
  ca-certificates curl python3
)

# deb-src lines, so `apt-get source sqlite3` works.
added_src=0
[ "$(bash "$(dirname "$0")/enable-deb-src.sh")" = added ] && added_src=1

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

stamp=/var/lib/apt/periodic/bunkai-update-stamp
if [ "${#missing[@]}" -gt 0 ] || [ "$added_src" = 1 ] || [ ! -e "$stamp" ]; then
  apt-get update -qq
  mkdir -p "$(dirname "$stamp")" && touch "$stamp"
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Rust: the machines ship rustup's toolchain; Debian's cargo (1.63) is too old
# for current clap, so only fall back to it with a warning.
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: no cargo found; installing Debian's (may be too old: rustup's stable is recommended)" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cargo rustc
fi
echo "install-deps: ok"
