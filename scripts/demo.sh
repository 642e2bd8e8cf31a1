#!/usr/bin/env bash
# The demo `make demo` runs after the build: each of bunkai's five
# subsystems doing its job on a small bundled program, in under a minute.
#
#   scripts/demo.sh [--only STEP,...] [DIR]
#
#   scatter  demo1 (1,024 generated functions) split into a launcher and one
#            library per function, grouped, served over HTTP on loopback and
#            started from its URL; its output compared with the native run's
#   trace    examples/server.c traced for one request (accept to close),
#            reported, and its pages drawn (pages.svg)
#   share    pigz -p 3 run across three hosts: this machine's own network
#            namespaces (home and two nodes), a cluster key made for the demo
#   flow     examples/request.xml woven into a running server built with
#            `bunkai flow cc`; one request's flow printed and drawn (flows.svg)
#   mod      modules loaded, swapped, refused and unloaded in a running
#            sched-host
#
# Everything goes to DIR (default $BUNKAI_DEMO_DIR, else a new
# /tmp/bunkai-demo.XXXXXX), which must be new or empty and outside the
# repository; no file of the repository changes. Each step prints one line
# (what happened, where its output is) and the demo ends with a summary
# (step, time, ok/FAILED); each step's commands and their output are in
# DIR/STEP/log. Every command has a deadline. The processes and namespaces
# the demo starts are removed when it ends, also on Ctrl-C (exit 130).
# Exit status: 0 if every step was ok, 1 if one failed, 2 for bad usage.
# Needs root (network namespaces) and the build (`make`); $BUNKAI names
# another build's CLI.
set -uo pipefail
export LC_ALL=C # $EPOCHREALTIME with a dot, tools' messages as the checks expect

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
BUNKAI=${BUNKAI:-$ROOT/build/bin/bunkai}
# the helpers, runtimes and examples beside the CLI, as the CLI finds them
LIB=$(realpath -m "$(dirname "$BUNKAI")/../lib/bunkai")
STEPS=(scatter trace share flow mod)
declare -A LIMIT=([scatter]=180 [trace]=90 [share]=90 [flow]=90 [mod]=60)

# usage WHAT [FIX]: one line, exit 2 (the fix defaults to the usage)
usage() {
  echo "bunkai demo: $1 (${2:-usage: scripts/demo.sh [--only STEP,...] [DIR]; steps: ${STEPS[*]}})" >&2
  exit 2
}

# ---------------------------------------------------------------------------
# One step, run as `demo.sh --step NAME DIR OWNER` under a deadline: its
# commands' output goes to DIR/NAME/log, its one line to stdout.

# A process's start time (field 22 of /proc/PID/stat): tells it from a
# later process with the same pid.
start_time() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  set -- $s
  echo "${20}"
}

alive() { # PID: running (a zombie is not)
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  s=${s##*) }
  [ "${s:0:1}" != Z ]
}

step_main() {
  local name=$1
  DIR=$2
  OWNER=$3
  W=$DIR/$name
  LOG=$W/log
  mkdir -p "$W" || { echo "FAILED: cannot create $W"; exit 1; }
  cd "$W" || exit 1
  exec 3>&1 >>"$LOG" 2>&1
  BG=()
  trap stop_all EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
  "step_$name"
}

# The step's one line, then the step ends (ok).
done_() { echo "$*" >&3; exit 0; }

fail() { echo "FAILED: $* (log: $LOG)" >&3; exit 1; }

# The command as the reader would type it.
show() { local s="$*"; s=${s//$BUNKAI/bunkai}; s=${s//$ROOT\//}; echo "$s"; }

# run LIMIT CMD...: runs CMD with a deadline of LIMIT seconds, its stderr to
# $ERR (default: the log); a failure or a hang ends the step naming CMD.
run() {
  local limit=$1 rc=0 err=${ERR:-$W/.stderr}
  shift
  echo "\$ $(show "$@")" >>"$LOG"
  timeout --foreground -k 5 "$limit" "$@" 2>"$err" || rc=$?
  [ "$err" = "$W/.stderr" ] && cat "$err" >>"$LOG"
  if [ $rc = 124 ] || [ $rc = 137 ]; then
    fail "\`$(show "$@")\` had no end within $limit s (killed)"
  elif [ $rc != 0 ]; then
    fail "\`$(show "$@")\` exited with status $rc: $(grep . "$err" | tail -n 1)"
  fi
  return 0
}

# bg CMD...: starts CMD in the background (its pid in $!), recorded so that
# the step, or the demo if the step is killed, stops it.
bg() {
  echo "\$ $(show "$@") &" >>"$LOG"
  "$@" &
  local pid=$!
  BG+=("$pid")
  echo "$pid $(start_time "$pid")" >>"$DIR/.pids"
}

# poll LIMIT WHAT CMD...: until CMD succeeds; after LIMIT seconds the step
# fails saying WHAT did not happen, and at once if process $WATCH (the one
# that should make it happen) has ended.
poll() {
  local limit=$1 what=$2 t0=$EPOCHREALTIME
  shift 2
  until "$@" 2>/dev/null; do
    if [ $(( (${EPOCHREALTIME/./} - ${t0/./}) / 1000000 )) -ge "$limit" ]; then
      fail "$what: not within $limit s"
    fi
    if [ -n "${WATCH:-}" ] && ! alive "$WATCH"; then
      fail "$what: it exited first"
    fi
    sleep 0.05
  done
}

# wait_pid PID LIMIT WHAT: PID's exit status (0 or the step fails).
wait_pid() {
  local pid=$1 rc=0
  poll "$2" "\`$3\` (pid $pid) to end" eval "! alive $pid"
  wait "$pid" || rc=$?
  [ $rc = 0 ] || fail "\`$3\` exited with status $rc"
}

stop() { # PID: SIGTERM, then SIGKILL after 5 s
  kill -TERM "$1" 2>/dev/null || return 0
  local i
  for i in $(seq 100); do alive "$1" || break; sleep 0.05; done
  kill -KILL "$1" 2>/dev/null
  wait "$1" 2>/dev/null
  return 0
}

stop_all() {
  local p
  for p in "${BG[@]}"; do stop "$p"; done
  [ -z "${HOSTS_UP:-}" ] || timeout 30 "$BUNKAI" share hosts down --owner "$OWNER"
  rm -f "$W/.stderr"
}

step_scatter() {
  run 30 python3 "$ROOT/tests/programs/demo/gen-demo1.py" demo1.c 1024
  run 60 clang-14 -O2 -o demo1-native demo1.c
  run 30 ./demo1-native >native.out
  ERR=scatter.txt run 150 "$BUNKAI" scatter -o out demo1.c
  run 30 out/bin/demo1 >launcher.out
  cmp -s native.out launcher.out || fail "out/bin/demo1 printed $(head -c 80 launcher.out), the native build $(head -c 80 native.out)"
  ERR=profile.txt run 30 "$BUNKAI" scatter profile out
  ERR=group.txt run 60 "$BUNKAI" scatter group out --threshold 16KiB
  bg "$BUNKAI" scatter serve out --listen 127.0.0.1:0 >url
  local server=$!
  WATCH=$server poll 30 "bunkai scatter serve to print its URL" test -s url
  local url
  url=$(head -n 1 url)
  ERR=run.txt run 60 "$BUNKAI" scatter run "$url" --cache cache -v >scattered.out
  stop "$server"
  cmp -s native.out scattered.out || fail "run from $url printed $(head -c 80 scattered.out), the native build $(head -c 80 native.out)"
  local libs groups fetched
  libs=$(grep -o '[0-9]* libraries' scatter.txt | head -n 1)
  groups=$(grep -o '[0-9]* groups at' group.txt | head -n 1)
  fetched=$(grep -o '[0-9]* groups preloaded, [0-9]* fetched on demand' run.txt)
  [ -n "$fetched" ] || fail "bunkai scatter run -v did not say what it fetched (run.txt)"
  done_ "demo1 (1,024 functions) split into a launcher + ${libs:-? libraries}, ${groups% at} in first-call order; started from $url: ${fetched}; printed what the native build prints ($W/scattered.out, native.out)"
}

step_trace() {
  run 60 cc -O2 -g -o server "$ROOT/examples/server.c"
  rm -f port
  bg "$BUNKAI" trace record -o request.bkt --start-syscall accept --stop-at-close -- ./server port 1 2>record.txt
  local rec=$!
  WATCH=$rec poll 60 "the traced server to write its port" test -s port
  run 20 curl -sS --max-time 15 "http://127.0.0.1:$(cat port)/hello" >reply.txt
  grep -q "hello from /hello" reply.txt || fail "the traced server answered $(head -c 80 reply.txt)"
  wait_pid "$rec" 60 "bunkai trace record"
  run 30 "$BUNKAI" trace report request.bkt >report.txt
  run 30 "$BUNKAI" trace report request.bkt --json >report.json
  run 30 "$BUNKAI" trace calls request.bkt --depth 2 >calls.txt
  ERR=pages.txt run 30 "$BUNKAI" trace pages request.bkt -o pages.svg
  local what
  what=$(python3 - report.json <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
ins = sum(s["instructions"] for s in r["streams"])
refs = sum(s["memory_references"] for s in r["streams"])
comps = sorted((c for c in r["components"] if c.get("instructions")), key=lambda c: -c["instructions"])[:3]
print(f"{ins:,} instructions, {refs:,} memory references ("
      + ", ".join(f"{c['name']} {c['percent']:.0f}%" for c in comps) + ")")
EOF
  ) || fail "report.json: cannot read it"
  done_ "one request to examples/server.c, traced from accept to close: $what; its pages drawn in $W/pages.svg (calls.txt, report.txt)"
}

step_share() {
  [ "$(id -u)" = 0 ] || fail "the hosts are network namespaces, which need root (run make demo as root)"
  export BUNKAI_SHARE_KEY=$W/share.key
  run 10 "$BUNKAI" share key --key "$W/share.key"
  HOSTS_UP=1
  run 30 "$BUNKAI" share hosts up 2 --owner "$OWNER" --json >hosts.json
  local home n1 a1 n2 a2
  read -r home n1 a1 n2 a2 < <(python3 -c '
import json, sys
h = json.load(open(sys.argv[1]))
print(h["home"], *[x for n in h["nodes"] for x in (n["netns"], n["addr"])])' hosts.json) ||
    fail "hosts.json: cannot read it"
  local node1 node2
  bg ip netns exec "$n1" "$BUNKAI" share node --key "$W/share.key" --listen "$a1:7000" >node1.txt 2>node1.log
  node1=$!
  bg ip netns exec "$n2" "$BUNKAI" share node --key "$W/share.key" --listen "$a2:7000" >node2.txt 2>node2.log
  node2=$!
  WATCH=$node1 poll 30 "node 1 to listen" grep -q "^listening on" node1.txt
  WATCH=$node2 poll 30 "node 2 to listen" grep -q "^listening on" node2.txt
  seq 1000000 >numbers
  ERR=run.txt run 120 ip netns exec "$home" "$BUNKAI" share run --key "$W/share.key" \
    --nodes "$a1:7000,$a2:7000" -v --json -- pigz -p 3 -c numbers >numbers.gz
  local same=0
  timeout 60 pigz -dc numbers.gz | cmp -s - numbers && same=1
  [ $same = 1 ] || fail "numbers.gz does not decompress to numbers"
  local what
  what=$(python3 - run.txt <<'EOF'
import json, sys
v = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
hosts = v["hosts"]
if sum(h["threads"] for h in hosts[1:]) < 1:
    sys.exit("no thread ran on a node")
moved = sum(h["pages_in"] for h in hosts)
print("threads: " + ", ".join(f"{h['name']} {h['threads']}" for h in hosts)
      + f"; {moved:,} pages moved; {v['wall_s']:.2f} s")
EOF
  ) || fail "run.txt: $(tail -n 1 run.txt | head -c 200)"
  done_ "pigz -p 3 compressed 1,000,000 lines across three hosts (network namespaces: home + 2 nodes) with the demo's own key; $what; the output decompresses to the input ($W/numbers.gz, run.txt)"
}

flow_ended() {
  timeout 10 "$BUNKAI" flow report >report.txt && grep -q free_request report.txt
}

step_flow() {
  export BUNKAI_FLOW_DIR=$W/buffers
  mkdir -p "$BUNKAI_FLOW_DIR"
  run 90 "$BUNKAI" flow cc -O2 -o server "$ROOT/examples/server.c"
  rm -f port
  bg env BUNKAI_HOST=1 BUNKAI_FLOW_IDS="$W/flow.ids" LD_PRELOAD="$LIB/libbunkai-host.so $LIB/libbunkai-flow.so" ./server port >server.log 2>&1
  local server=$!
  WATCH=$server poll 30 "the server to write its port" test -s port
  run 60 "$BUNKAI" flow weave --pid "$server" "$ROOT/examples/request.xml"
  run 20 curl -sS --max-time 15 "http://127.0.0.1:$(cat port)/hello" >reply.txt
  grep -q "hello from /hello" reply.txt || fail "the woven server answered $(head -c 80 reply.txt)"
  # the server frees the request after it has answered: the last step
  # can come just after the reply
  poll 10 "the flow to reach free_request" flow_ended
  run 30 "$BUNKAI" flow report --svg flows.svg >report.txt
  stop "$server"
  local head
  head=$(grep -m 1 '^flow 0x' report.txt) || fail "report.txt has no flow"
  done_ "examples/request.xml woven into a running server (pid $server); one request followed: ${head%%:*}, ${head#*: } from read_request to free_request; the steps in $W/report.txt, drawn in flows.svg"
}

step_mod() {
  local S=$LIB/examples/sched
  export BUNKAI_HOST_SOCKET=$W/host.sock
  rm -f host.sock
  bg "$S/sched-host" --socket host.sock >rounds.log
  local host=$!
  WATCH=$host poll 30 "sched-host to open its socket" test -S host.sock
  ERR=mod.txt run 30 "$BUNKAI" mod load "$S/rr.o"
  poll 30 "a round scheduled by rr" grep -q "policy rr " rounds.log
  ERR=swap.txt run 30 "$BUNKAI" mod swap -L "$S" rr "$S/edf.o"
  poll 30 "a round scheduled by edf" grep -q "policy edf " rounds.log
  head -c 600 "$S/fifo.o" >broken.o
  local rc=0
  echo "\$ bunkai mod load broken.o   # a damaged module: refused" >>"$LOG"
  timeout 30 "$BUNKAI" mod load broken.o 2>refused.txt || rc=$?
  [ $rc != 0 ] && [ $rc != 124 ] || fail "bunkai mod load broken.o: exit status $rc, not a refusal"
  [ "$(wc -l <refused.txt)" = 1 ] || fail "the refusal of broken.o is not one line (refused.txt)"
  run 30 "$BUNKAI" mod list >list.txt
  grep -q edf list.txt && grep -q sched-util list.txt || fail "mod list does not show edf and sched-util (list.txt)"
  local before
  before=$(wc -l <rounds.log)
  ERR=unload.txt run 30 "$BUNKAI" mod unload --cascade sched-util
  poll 30 "a round with no module (builtin) after the unload" eval "tail -n +$((before + 1)) rounds.log | grep -q 'policy builtin '"
  run 30 "$BUNKAI" mod list >list-after.txt
  grep -q " 0 modules" list-after.txt || fail "modules left after the unload (list-after.txt)"
  alive "$host" || fail "sched-host is gone"
  stop "$host"
  local rr edf
  rr=$(grep -c "policy rr " rounds.log)
  edf=$(grep -c "policy edf " rounds.log)
  done_ "into a running sched-host (pid $host): rr loaded, swapped for edf (sched-util loaded with it), a damaged module refused in one line, both unloaded; the host kept scheduling throughout ($rr rounds by rr, $edf by edf, then its builtin policy; $W/rounds.log, mod.txt)"
}

if [ "${1:-}" = --step ]; then
  step_main "$2" "$3" "$4"
  exit 1
fi

# ---------------------------------------------------------------------------
# The demo: the steps one after another, then the summary.

only=()
DIR=${BUNKAI_DEMO_DIR:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --only)
      [ $# -ge 2 ] || usage "--only needs a list of steps"
      IFS=, read -r -a only <<<"$2"
      for s in "${only[@]}"; do
        [ -n "${LIMIT[$s]:-}" ] || usage "no step \`$s\`"
      done
      shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) usage "unknown option $1" ;;
    *) DIR=$1 ;;
  esac
  shift
done
[ ${#only[@]} -gt 0 ] && STEPS=("${only[@]}")

[ -x "$BUNKAI" ] || { echo "bunkai demo: $BUNKAI is missing (run make first)" >&2; exit 1; }
for tool in python3 clang-14 cc curl pigz ip timeout cmp; do
  command -v "$tool" >/dev/null || { echo "bunkai demo: $tool is missing (run scripts/install-deps.sh)" >&2; exit 1; }
done
if [ -z "$DIR" ]; then
  DIR=$(mktemp -d /tmp/bunkai-demo.XXXXXX) || exit 1
else
  DIR=$(realpath -m "$DIR")
  case "$DIR/" in
    "$(realpath "$ROOT")/"*) usage "$DIR is inside the repository" "give a directory outside it" ;;
  esac
  mkdir -p "$DIR" 2>/dev/null || usage "cannot create $DIR" "give a directory you can write"
  [ -z "$(ls -A "$DIR")" ] || usage "$DIR is not empty" "give a new or empty directory"
fi

CUR=
# What the steps left: their background processes (the same processes:
# pid and start time), and the namespaces they made for us.
cleanup() {
  if [ -n "$CUR" ]; then
    kill -TERM "$CUR" 2>/dev/null
    wait "$CUR" 2>/dev/null
    CUR=
  fi
  if [ -f "$DIR/.pids" ]; then
    local pid st
    while read -r pid st; do
      [ -n "$st" ] && [ "$(start_time "$pid")" = "$st" ] && kill -KILL "$pid" 2>/dev/null
    done <"$DIR/.pids"
    rm -f "$DIR/.pids"
  fi
  if [ "$(id -u)" = 0 ] && ls /run/netns 2>/dev/null | grep -q "^bk-share-$$-"; then
    "$BUNKAI" share hosts down --owner $$ >>"$DIR/cleanup.log" 2>&1
  fi
}
interrupted() {
  trap '' INT TERM
  cleanup
  echo "bunkai demo: interrupted (what ran is in $DIR)" >&2
  exit 130
}
trap interrupted INT TERM
trap cleanup EXIT

echo "bunkai demo: each subsystem on a small program, loopback and network namespaces only; output in $DIR"
n=${#STEPS[@]}
i=0
failed=0
declare -A TOOK RESULT
T0=$EPOCHREALTIME
for s in "${STEPS[@]}"; do
  i=$((i + 1))
  t0=$EPOCHREALTIME
  timeout -k 5 "${LIMIT[$s]}" bash "${BASH_SOURCE[0]}" --step "$s" "$DIR" $$ >"$DIR/.line" &
  CUR=$!
  rc=0
  wait "$CUR" || rc=$?
  CUR=
  TOOK[$s]=$(( (${EPOCHREALTIME/./} - ${t0/./}) / 100000 ))
  line=$(head -n 1 "$DIR/.line")
  if [ $rc = 0 ] && [ -n "$line" ]; then
    RESULT[$s]=ok
  else
    RESULT[$s]=FAILED
    failed=$((failed + 1))
    if [ $rc = 124 ] || [ $rc = 137 ]; then
      line="FAILED: no end within ${LIMIT[$s]} s (killed; log: $DIR/$s/log)"
    elif [ -z "$line" ]; then
      line="FAILED: exit status $rc (log: $DIR/$s/log)"
    fi
  fi
  echo "[$i/$n] $s: $line"
done
rm -f "$DIR/.line"
total=$(( (${EPOCHREALTIME/./} - ${T0/./}) / 100000 ))

tenths() { echo "$(($1 / 10)).$(($1 % 10)) s"; }
echo
echo "bunkai demo: summary (output in $DIR)"
printf '  %-8s %9s  %s\n' step time result
for s in "${STEPS[@]}"; do
  printf '  %-8s %9s  %s\n' "$s" "$(tenths "${TOOK[$s]}")" "${RESULT[$s]}"
done
if [ $failed = 0 ]; then
  printf '  %-8s %9s  %s\n' total "$(tenths "$total")" "$n ok"
  exit 0
fi
printf '  %-8s %9s  %s\n' total "$(tenths "$total")" "$failed of $n FAILED"
exit 1
