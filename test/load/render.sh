#!/bin/sh
# render.sh REPORT.html [OUT.png]: renders a load report in headless Chromium (Debian's
# `chromium`) and takes a screenshot, to check the self-contained page draws without a network
# (every network feature of the browser is off). Skips (exit 0) when no chromium is installed.
#
#   go run ./cmd/sluice mock --listen 127.0.0.1:8000 --ttft 20ms --itl 5ms &
#   go run ./cmd/sluice load --target http://127.0.0.1:8000 --synthetic in=uniform:50:500,out=uniform:8:64 \
#       --rate 20 --duration 5s --slo ttft=100ms,itl=20ms --html /tmp/report.html
#   test/load/render.sh /tmp/report.html /tmp/report.png
set -eu
html=${1:?usage: render.sh REPORT.html [OUT.png]}
out=${2:-${html%.html}.png}
bin=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$bin" ]; then
	echo "render.sh: no chromium found; skipped" >&2
	exit 0
fi
abs=$(cd "$(dirname "$html")" && pwd)/$(basename "$html")
case $out in /*) ;; *) out=$(pwd)/$out ;; esac
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$bin" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
	--disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$profile" \
	--screenshot="$out" --window-size=1280,2000 "file://$abs" >/dev/null 2>&1
test -s "$out" || { echo "render.sh: no screenshot written" >&2; exit 1; }
echo "render.sh: wrote $out"
