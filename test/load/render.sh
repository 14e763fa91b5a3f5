#!/bin/sh
# render.sh REPORT.html [OUT.png]: renders a load report in headless Chromium (Debian's
# `chromium`) and takes a screenshot, to check the self-contained page draws without a network.
# Skips (exit 0) when no chromium is installed.
set -eu
html=${1:?usage: render.sh REPORT.html [OUT.png]}
out=${2:-${html%.html}.png}
bin=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$bin" ]; then
	echo "render.sh: no chromium found; skipped" >&2
	exit 0
fi
abs=$(cd "$(dirname "$html")" && pwd)/$(basename "$html")
"$bin" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,2400 \
	--screenshot="$out" "file://$abs" >/dev/null 2>&1
test -s "$out" || { echo "render.sh: no screenshot written" >&2; exit 1; }
echo "render.sh: wrote $out"
