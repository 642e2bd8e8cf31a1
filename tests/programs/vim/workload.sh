#!/usr/bin/env bash
# Deterministic, non-interactive Vim workloads (no tty needed; stdin unused).
#
# Usage: workload.sh VIM_BIN [init|heavy]
#
#   init  (default) the paper's "Vim-init": start Vim, type 3 characters,
#         force-quit.  Prints the written file ("abc").
#   heavy generate a 10,000-line buffer, :substitute over it, :sort it,
#         regex searches, a vimscript loop, sha256 of the buffer; prints the
#         results.
#
# Output on stdout is byte-identical from run to run; exit status 0 on
# success, non-zero if Vim fails or reports an error.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 VIM_BIN [init|heavy]" >&2
  exit 2
fi
VIM_BIN="$1"
MODE="${2:-init}"
case "$VIM_BIN" in */*) VIM_BIN="$(cd "$(dirname "$VIM_BIN")" && pwd)/$(basename "$VIM_BIN")" ;; esac

WORK="$(mktemp -d "${TMPDIR:-/tmp}/bunkai-vim-workload.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

# Nothing from the user's environment may leak in.
export HOME="$WORK" LC_ALL=C LANG=C TERM=dumb
unset VIMINIT EXINIT VIM VIMRUNTIME MYVIMRC 2>/dev/null || true

# -u NONE: no vimrc/plugins, -i NONE: no viminfo, -N: nocompatible,
# -n: no swap file, -es: silent Ex mode (no terminal I/O at all).
VIM=("$VIM_BIN" -u NONE -i NONE -N -n -es)

case "$MODE" in
  init)
    "${VIM[@]}" -c 'normal iabc' -c 'w! out.txt' -c 'q!' </dev/null
    cat out.txt
    ;;
  heavy)
    cat >heavy.vim <<'EOF'
set nomore report=999999 shortmess+=F
let s:out = []
try
  " 10,000 generated lines: 'row NNNNN key KKKK word WWW'
  call setline(1, map(range(1, 10000),
        \ {_, v -> printf('row %05d key %04d word %s', v, (v * 7919) % 10007,
        \                 ['alpha', 'beta', 'gamma', 'delta', 'epsilon'][v % 5])}))
  call add(s:out, 'lines: ' . line('$'))
  call add(s:out, 'sha256 initial: ' . sha256(join(getline(1, '$'), "\n")))

  " substitute: double every key, upper-case every 'gamma'
  %s/key \(\d\+\)/\='key ' . printf('%05d', str2nr(submatch(1), 10) * 2)/
  %s/\<gamma\>/GAMMA/g
  call add(s:out, 'after substitute, line 3: ' . getline(3))
  call add(s:out, 'GAMMA lines: ' . len(filter(getline(1, '$'), 'v:val =~# "GAMMA"')))

  " sort numerically on the key, then delete duplicate-word neighbours
  sort n /.*key /
  call add(s:out, 'after sort, first: ' . getline(1))
  call add(s:out, 'after sort, last: ' . getline('$'))
  g/word beta$/d
  call add(s:out, 'after :g//d lines: ' . line('$'))
  call add(s:out, 'sha256 final: ' . sha256(join(getline(1, '$'), "\n")))

  " a small vimscript loop computing sums
  let s:sum = 0
  let s:sq = 0
  for i in range(1, 100000)
    let s:sum += i
    let s:sq = (s:sq + i * i) % 1000003
  endfor
  call add(s:out, 'sum 1..100000: ' . s:sum)
  call add(s:out, 'sum of squares mod 1000003: ' . s:sq)

  " string functions and a dictionary
  let s:d = {}
  for w in split(join(getline(1, 200), ' '), '\s\+')
    let s:d[w] = get(s:d, w, 0) + 1
  endfor
  call add(s:out, 'distinct words in first 200 lines: ' . len(s:d))
  call add(s:out, 'epsilon count: ' . get(s:d, 'epsilon', 0))

  " write the buffer, re-read it, and compare
  silent write! buffer.txt
  call add(s:out, 'buffer.txt lines: ' . len(readfile('buffer.txt')))
catch
  call add(s:out, 'ERROR: ' . v:exception . ' at ' . v:throwpoint)
  call writefile(s:out, 'result.txt')
  cquit!
endtry
call writefile(s:out, 'result.txt')
qall!
EOF
    rc=0
    "${VIM[@]}" -S heavy.vim </dev/null || rc=$?
    [[ -f result.txt ]] && cat result.txt
    if [[ $rc -ne 0 ]]; then
      echo "workload.sh: vim exited with status $rc" >&2
      exit 1
    fi
    ;;
  *)
    echo "usage: $0 VIM_BIN [init|heavy]" >&2
    exit 2
    ;;
esac
