#!/usr/bin/env bash
# pair.sh measures two Sluice builds paired: the same simulator, the same fixed-rate load
# (vegeta, a small non-streaming chat request), the builds alternated round by round so that
# a noisy machine shifts both alike. Per round and build it prints the gateway's CPU time per
# request (/proc/PID/stat) and the kernel's part of it, its peak RSS (VmHWM), vegeta's p50/p99 and, where perf can read
# tracepoints (root), the gateway's futex wake calls (thread wake-ups) and context switches
# per request.
#
#   test/bench/pair.sh [-r RATE] [-n ROUNDS] [-d SECONDS] BIN_A BIN_B
#
# BIN_A and BIN_B are sluice binaries (go build -o /tmp/a ./cmd/sluice on each commit), or
# scripts that exec one with an environment (printf '#!/bin/sh\nGOGC=400 exec /tmp/a "$@"\n').
# Defaults: 2000 req/s, 3 rounds, 10 s measured per turn after 3 s of warm-up. Ports:
# PAIR_PORT (default 21001) and the next two, below Linux's ephemeral range. vegeta is built
# from the module proxy into a temporary directory. Takes about (2 × ROUNDS × (SECONDS+5)) s.
set -euo pipefail

rate=2000 rounds=3 secs=10
while getopts "r:n:d:" o; do
	case $o in
	r) rate=$OPTARG ;;
	n) rounds=$OPTARG ;;
	d) secs=$OPTARG ;;
	*) sed -n '2,14p' "$0"; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
if [ $# -ne 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
	sed -n '2,14p' "$0"
	exit 2
fi
builds=("$1" "$2")
port=${PAIR_PORT:-21001}
gw=127.0.0.1:$port admin=127.0.0.1:$((port + 1)) sim=127.0.0.1:$((port + 2))

. "$(dirname "$0")/lib.sh"
bench_init
bench_vegeta "$gw"
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
sticks() { awk '{print $15}' "/proc/$1/stat"; }
perf_ok=false
if command -v perf >/dev/null && perf stat -e syscalls:sys_enter_futex -- true >/dev/null 2>&1; then
	perf_ok=true
fi

"${builds[0]}" mock --listen "$sim" >"$tmp/sim.log" 2>&1 &
pids+=($!)
wait_up "$sim"
hz=$(getconf CLK_TCK)
echo "| round | build | CPU/request | of which kernel | peak RSS | p50 | p99 | futex wakes/request | context switches/request |"
echo "|---|---|---|---|---|---|---|---|---|"
for round in $(seq "$rounds"); do
	for b in 0 1; do
		"${builds[$b]}" serve --upstream "http://$sim" --listen "$gw" --admin "$admin" >"$tmp/gw.log" 2>&1 &
		g=$!
		pids+=("$g")
		wait_up "$gw"
		attack 3 /dev/null
		t0=$(ticks "$g") s0=$(sticks "$g")
		if $perf_ok; then
			perf stat -x, -o "$tmp/perf" -e syscalls:sys_enter_futex --filter 'op == 129' \
				-e context-switches -p "$g" -- sleep "$secs" &
			pp=$!
		fi
		attack "$secs" "$tmp/res"
		t1=$(ticks "$g") s1=$(sticks "$g")
		wakes=- switches=-
		if $perf_ok; then
			wait "$pp" || true
			n=$((rate * secs))
			wakes=$(awk -F, -v n="$n" '/futex/ {printf "%.2f", $1 / n}' "$tmp/perf")
			switches=$(awk -F, -v n="$n" '/context-switches/ {printf "%.2f", $1 / n}' "$tmp/perf")
		fi
		# "Latencies [min, mean, 50, 90, 95, 99, max]  a, b, c, ...": the 50th and the 99th
		lat=$("$vegeta" report <"$tmp/res" | awk '/^Latencies/ {sub(/.*] +/, ""); split($0, v, ", "); print v[3] " | " v[6]}')
		cpu=$(awk -v d="$((t1 - t0))" -v hz="$hz" -v n="$((rate * secs))" 'BEGIN {printf "%.0f µs", d / hz * 1e6 / n}')
		sys=$(awk -v d="$((s1 - s0))" -v hz="$hz" -v n="$((rate * secs))" 'BEGIN {printf "%.0f µs", d / hz * 1e6 / n}')
		rss=$(awk '/^VmHWM/ {printf "%.1f MiB", $2 / 1024}' "/proc/$g/status")
		echo "| $round | ${builds[$b]} | $cpu | $sys | $rss | $lat | $wakes | $switches |"
		kill "$g"
		wait "$g" 2>/dev/null || true
	done
done
