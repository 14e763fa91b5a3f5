#!/usr/bin/env bash
# onset.sh measures Sluice builds against a heavy load that arrives all at once after a quiet
# time, as the harness's turns do (a target waits some 15 s while the others run): the same
# simulator (zero delay) behind each build, 2 s of load at RATE, IDLE seconds of nothing
# (the gateway goes back to one processor, lets its heap floor go and returns its memory),
# then 3 s at RATE again. Per run and build it prints the p99 of the 3 s and the worst
# latency of its first 200 ms. A gateway that falls behind at the onset can stay behind (its
# clients open more connections, each taking memory and work): a p99 of hundreds of ms.
# The builds take turns run by run.
#
#   test/bench/onset.sh [-n RUNS] [-r RATE] [-i IDLE] BIN...
#
# A BIN is a sluice binary, or a script that execs one with an environment
# (printf '#!/bin/sh\nGOMAXPROCS=2 exec /tmp/a "$@"\n'). Defaults: 6 runs, 5000 req/s, 12 s.
# Ports: ONSET_PORT (default 23001) and the next two. vegeta is built from the module proxy
# into a temporary directory. Takes about RUNS × builds × (IDLE + 8) s.
set -euo pipefail

runs=6 rate=5000 idle=12
while getopts "n:r:i:" o; do
	case $o in
	n) runs=$OPTARG ;;
	r) rate=$OPTARG ;;
	i) idle=$OPTARG ;;
	*) sed -n '2,16p' "$0"; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
if [ $# -lt 1 ]; then
	sed -n '2,16p' "$0"
	exit 2
fi
for b in "$@"; do [ -x "$b" ] || { echo "onset.sh: $b is not executable" >&2; exit 2; }; done
port=${ONSET_PORT:-23001}
gw=127.0.0.1:$port admin=127.0.0.1:$((port + 1)) sim=127.0.0.1:$((port + 2))

. "$(dirname "$0")/lib.sh"
bench_init
bench_vegeta "$gw"

"$1" mock --listen "$sim" >"$tmp/sim.log" 2>&1 &
pids+=($!)
wait_up "$sim"
echo "| run | build | p99 of the 3 s | worst in the first 200 ms |"
echo "|---|---|---|---|"
for run in $(seq "$runs"); do
	for b in "$@"; do
		"$b" serve --upstream "http://$sim" --listen "$gw" --admin "$admin" >"$tmp/gw.log" 2>&1 &
		g=$!
		pids+=("$g")
		wait_up "$gw"
		attack 2 /dev/null
		sleep "$idle"
		attack 3 "$tmp/res"
		# vegeta's CSV: timestamp (ns), status, latency (ns), ...
		"$vegeta" encode --to csv <"$tmp/res" >"$tmp/res.csv"
		p99=$(cut -d, -f3 "$tmp/res.csv" | sort -n | awk '{l[NR] = $1} END {printf "%.1f", l[int(NR * 0.99)] / 1e6}')
		first=$(awk -F, 'NR == 1 || $1 < t0 {t0 = $1} {t[NR] = $1; l[NR] = $3}
			END {for (i = 1; i <= NR; i++) if (t[i] - t0 < 2e8 && l[i] > m) m = l[i]; printf "%.1f", m / 1e6}' "$tmp/res.csv")
		echo "| $run | $b | $p99 ms | $first ms |"
		kill "$g"
		wait "$g" 2>/dev/null || true
	done
done
