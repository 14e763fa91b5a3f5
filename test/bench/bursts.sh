#!/usr/bin/env bash
# bursts.sh measures Sluice builds against bursts of streams that find the gateway idle: the
# same simulator (zero delay) behind each, test/bench/bursts run against each build in turn,
# ROUNDS times, so that a noisy machine shifts them alike. Each run is BURSTS bursts of 200
# streams × 64 tokens, 2.5 s apart (the adaptive processors fall back to one in 2 s).
#
#   test/bench/bursts.sh [-n ROUNDS] [-b BURSTS] BIN...
#
# A BIN is a sluice binary, or a script that execs one with an environment
# (printf '#!/bin/sh\nGOMAXPROCS=2 exec /tmp/a "$@"\n'). Ports: BURSTS_PORT (default 22001)
# and up, two a build and one for the simulator. Takes about ROUNDS × builds × BURSTS × 3 s.
set -euo pipefail

rounds=4 bursts=8
while getopts "n:b:" o; do
	case $o in
	n) rounds=$OPTARG ;;
	b) bursts=$OPTARG ;;
	*) sed -n '2,11p' "$0"; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
if [ $# -lt 1 ]; then
	sed -n '2,11p' "$0"
	exit 2
fi
for b in "$@"; do [ -x "$b" ] || { echo "bursts.sh: $b is not executable" >&2; exit 2; }; done
cd "$(dirname "$0")/../.."
. test/bench/lib.sh
bench_init
go build -o "$tmp/bursts" ./test/bench/bursts
port=${BURSTS_PORT:-22001}
sim=127.0.0.1:$port
for p in $(seq "$port" $((port + 2 * $#))); do
	if curl -s -o /dev/null --max-time 1 "http://127.0.0.1:$p/"; then
		echo "bursts.sh: port $p is in use (a gateway of an earlier run still draining?)" >&2
		exit 1
	fi
done
"$1" mock --listen "$sim" >"$tmp/sim.log" 2>&1 &
pids+=($!)
gws=()
i=0
for b in "$@"; do
	i=$((i + 1))
	gw=127.0.0.1:$((port + 2 * i - 1)) admin=127.0.0.1:$((port + 2 * i))
	"$b" serve --upstream "http://$sim" --listen "$gw" --admin "$admin" >"$tmp/gw$i.log" 2>&1 &
	pids+=($!)
	gws+=("$gw")
done
for gw in "$sim" "${gws[@]}"; do
	for _ in $(seq 100); do
		curl -fsS -o /dev/null "http://$gw/v1/models" 2>/dev/null && break
		sleep 0.1
	done
done
for gw in "${gws[@]}"; do "$tmp/bursts" --bursts 1 "http://$gw" >/dev/null; done # warm-up
for r in $(seq "$rounds"); do
	i=0
	for b in "$@"; do
		printf 'round %d %s: ' "$r" "$b"
		"$tmp/bursts" --bursts "$bursts" "http://${gws[$i]}"
		i=$((i + 1))
	done
done
