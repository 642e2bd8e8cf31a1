#!/bin/bash
# trace/guest/build.sh OUT: the guest of `bunkai trace`'s full-system mode
# (issue 22, seed 001 §3): Debian's own kernel and an initramfs made here
# from Debian's packages, nothing downloaded but apt's. The initramfs holds
# busybox-static, apache2-bin with the modules the paper's two requests
# need and every library they load, the paper's HTML page (Fig. 2) and CGI
# program (Fig. 3), and an init that brings up the network (QEMU's user
# network: the guest is 10.0.2.15) and runs `apache2 -X` on port 80.
#
# Writes OUT/vmlinuz, OUT/System.map (the kernel's symbols: entry stubs and
# the scheduler's switch for the trace), OUT/initrd.gz and OUT/manifest (what
# went in, one path a line). Debian's /boot/System.map is a stub (the real
# one is in the -dbg package, about 1 GB), so System.map is the kernel's own
# /proc/kallsyms, read by booting the guest once with nokaslr (the addresses
# `bunkai trace record --system` boots it with) and bunkai.kallsyms, which
# makes the init write it to the second serial port. Idempotent; the inputs are apt packages:
# linux-image-amd64, busybox-static, apache2-bin, qemu-system-x86 (to run it).
#
# Run the guest (the host reaches Apache on 127.0.0.1:8080 only):
#   qemu-system-x86_64 -accel tcg -m 512 -nographic -no-reboot \
#     -kernel OUT/vmlinuz -initrd OUT/initrd.gz -append "console=ttyS0 quiet panic=-1" \
#     -netdev user,id=n0,hostfwd=tcp:127.0.0.1:8080-:80 -device e1000,netdev=n0
set -euo pipefail
die() { echo "trace/guest/build.sh: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: trace/guest/build.sh OUT"
OUT=$(realpath -m "$1")
HERE=$(cd "$(dirname "$0")" && pwd)

KVER=$(ls /lib/modules 2>/dev/null | grep -E '^[0-9].*-amd64$' | sort -V | tail -1) ||
  true
[ -n "$KVER" ] && [ -e "/boot/vmlinuz-$KVER" ] ||
  die "no Debian kernel in /boot (install it: apt-get install linux-image-amd64)"
[ -x /bin/busybox ] && ! readelf -l /bin/busybox 2>/dev/null | grep -q INTERP ||
  die "no static busybox (install it: apt-get install busybox-static)"
command -v cpio >/dev/null || die "no cpio (install it: apt-get install cpio)"
[ -x /usr/sbin/apache2 ] || die "no /usr/sbin/apache2 (install it: apt-get install apache2-bin)"
MODS=/usr/lib/apache2/modules
NIC=/lib/modules/$KVER/kernel/drivers/net/ethernet/intel/e1000/e1000.ko
[ -e "$NIC" ] || die "no e1000 module for $KVER (reinstall linux-image-$KVER)"

mkdir -p "$OUT"
STAGE=$(mktemp -d "$OUT/.stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
R=$STAGE/root
mkdir -p "$R"/{bin,sbin,etc,proc,sys,dev,tmp,run,www/htdocs,www/cgi-bin,www/logs,lib/modules}

# The libraries a file loads (ldd), at their own paths.
copy_libs_of() {
  ldd "$1" 2>/dev/null | grep -oE '/[^ ]+' | while read -r lib; do
    [ -e "$R$lib" ] && continue
    mkdir -p "$R$(dirname "$lib")"
    cp -L "$lib" "$R$lib"
  done
}
# Files at the same paths, with their libraries.
copy_with_libs() {
  for f in "$@"; do
    mkdir -p "$R$(dirname "$f")"
    cp -L "$f" "$R$f"
    copy_libs_of "$f"
  done
}

cp /bin/busybox "$R/bin/busybox"
cp "$NIC" "$R/lib/modules/e1000.ko"
APACHE_MODS="mpm_prefork authz_core mime dir alias cgi"
copy_with_libs /usr/sbin/apache2 $(for m in $APACHE_MODS; do echo "$MODS/mod_$m.so"; done)

# The paper's page and CGI program (bench/trace/apache.py has them too).
cp "$HERE/index.html" "$R/www/htdocs/index.html"
cc -O2 -o "$R/www/cgi-bin/hello.cgi" "$HERE/hello.c"
# A probe with known syscalls and page faults (tests/e2e/trace_system.rs).
cc -O2 -o "$R/www/cgi-bin/probe.cgi" "$HERE/probe.c"
copy_libs_of "$R/www/cgi-bin/hello.cgi"

{
  echo "ServerRoot /www"
  echo "ServerName localhost"
  echo "Listen 0.0.0.0:80"
  for m in $APACHE_MODS; do echo "LoadModule ${m}_module $MODS/mod_$m.so"; done
  cat <<'CONF'
User nobody
Group nogroup
PidFile /run/httpd.pid
DefaultRuntimeDir /run
Mutex file:/run default
ErrorLog /www/logs/error.log
LogLevel warn
TypesConfig /dev/null
AddType text/html .html
DocumentRoot /www/htdocs
ScriptAlias /cgi-bin/ /www/cgi-bin/
<Directory />
  Require all granted
</Directory>
CONF
} > "$R/etc/httpd.conf"
printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$R/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' > "$R/etc/group"
cp "$HERE/init" "$R/init"
chmod 755 "$R/init" "$R/www/cgi-bin/hello.cgi" "$R/www/cgi-bin/probe.cgi"

(cd "$R" && find . | sort > "$STAGE/manifest" && find . | cpio -o -H newc --quiet | gzip -6 > "$STAGE/initrd.gz")
cp "/boot/vmlinuz-$KVER" "$STAGE/vmlinuz"
# The symbols of the kernel as it runs (no KASLR), from one boot.
timeout 300 qemu-system-x86_64 -accel tcg -m 512 -display none -no-reboot \
  -kernel "$STAGE/vmlinuz" -initrd "$STAGE/initrd.gz" \
  -append "console=ttyS0 quiet panic=-1 nokaslr bunkai.kallsyms" \
  -serial "file:$STAGE/console" -serial "file:$STAGE/kallsyms" -net none </dev/null ||
  die "booting the guest to read its kallsyms failed (console: $(tail -3 "$STAGE/console" 2>/dev/null))"
grep -v '\[' "$STAGE/kallsyms" | tr -d '\r' > "$STAGE/System.map"
grep -q ' entry_SYSCALL_64$' "$STAGE/System.map" ||
  die "the guest's kallsyms has no entry_SYSCALL_64 (console: $(tail -3 "$STAGE/console" 2>/dev/null))"
for f in vmlinuz System.map initrd.gz manifest; do mv "$STAGE/$f" "$OUT/$f"; done
echo "trace/guest/build.sh: $OUT/initrd.gz ($(du -k "$OUT/initrd.gz" | cut -f1) KiB, $(wc -l < "$OUT/manifest") files), kernel $KVER"
