# lib.sh is what test/bench's load scripts share; they source it (it runs nothing itself).
#
#   bench_init                a temporary directory ($tmp), removed at exit with every process in $pids
#   bench_vegeta GW           vegeta built into $tmp ($vegeta) and the harness's small chat request to GW;
#                             then attack SECONDS OUTPUT sends it at $rate
#   wait_up HOST:PORT         waits (up to 10 s) until something listens there, else exits

bench_init() {
	tmp=$(mktemp -d)
	pids=()
	trap bench_cleanup EXIT
}

bench_cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	rm -rf "$tmp"
}

bench_vegeta() {
	GOBIN=$tmp go install github.com/tsenart/vegeta/v12@v12.13.0
	vegeta=$tmp/vegeta
	echo "POST http://$1/v1/chat/completions" >"$tmp/targets"
	printf '%s' '{"model":"sim-llama","messages":[{"role":"user","content":"Write one line about the sea."}],"max_tokens":16}' >"$tmp/body"
}

attack() { # seconds, output
	"$vegeta" attack -targets "$tmp/targets" -body "$tmp/body" -header "Content-Type: application/json" \
		-rate "$rate" -duration "${1}s" >"$2"
}

wait_up() { # host:port
	for _ in $(seq 100); do
		if (exec 3<>"/dev/tcp/${1%:*}/${1##*:}") 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	echo "$(basename "$0"): nothing listens on $1" >&2
	exit 1
}
