#!/usr/bin/env bash
# Builds a Debian package of a built tree (make all): build/bunkai_<version>_amd64.deb.
#   scripts/make-deb.sh                  (make deb)
# The package installs under /usr (bin/bunkai, lib/bunkai/, man pages,
# completions, docs) and depends on what the files link against (found
# with dpkg-shlibdeps) and on the tools bunkai runs: clang-14, lld-14 and
# llvm-14 (scatter, flow cc, mod), valgrind (trace), iproute2 (share's
# namespace harness), libc6-dev (compiling advice and modules).
# Install it with: apt install ./build/bunkai_<version>_amd64.deb
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/bin/bunkai ] || { echo "make-deb: build/bin/bunkai is missing (run make first)" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
commit=$(git rev-parse --short=8 HEAD 2>/dev/null || echo unknown)
debver="${version}+git${commit}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage="$work/bunkai_${debver}_amd64"
bash scripts/install.sh /usr "$stage" >/dev/null

# Shared-library dependencies of every ELF file we ship, as dpkg-shlibdeps
# computes them from the installed packages' symbols files.
mkdir -p "$work/src/debian"
printf 'Source: bunkai\n\nPackage: bunkai\nArchitecture: amd64\n' > "$work/src/debian/control"
elves=()
while IFS= read -r f; do
  [ "$(head -c 4 "$f" | od -An -tx1 | tr -d ' ')" = 7f454c46 ] && elves+=("$f")
done < <(find "$stage/usr" -type f)
# debug info stays out of the package (the build keeps it: build/bin/bunkai)
for f in "${elves[@]}"; do strip --strip-debug "$f"; done
shlibs=$(cd "$work/src" && dpkg-shlibdeps -O --ignore-missing-info -l"$stage/usr/lib/bunkai" \
           -e"${elves[@]}" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
[ -n "$shlibs" ] || { echo "make-deb: dpkg-shlibdeps found no dependencies (is dpkg-dev installed?)" >&2; exit 1; }
tools="clang-14, lld-14, llvm-14, valgrind, iproute2, libc6-dev"
size=$(du -sk "$stage/usr" | cut -f1)
mkdir -p "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<CTL
Package: bunkai
Version: $debver
Architecture: amd64
Maintainer: bunkai maintainers <maintainers@users.noreply.a-seed-5c46b6ff.example>
Installed-Size: $size
Depends: $shlibs, $tools
Section: devel
Priority: optional
Description: take programs apart while they run
 bunkai is one command with five subsystems: scatter splits a C program
 into a launcher and lazily loaded libraries that start over a slow link;
 trace records every instruction and memory reference of a program;
 share runs one unmodified multithreaded process across several hosts;
 flow follows one piece of data through threads, processes and hosts;
 mod loads, swaps and unloads modules in a running program.
CTL
out="build/bunkai_${debver}_amd64.deb"
dpkg-deb --root-owner-group --build "$stage" "$out" >/dev/null
echo "make-deb: $out ($(du -h "$out" | cut -f1)); install with: apt install ./$out"
