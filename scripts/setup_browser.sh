#!/usr/bin/env bash
# A headless browser for the test that renders the offline plots page (Debian/Ubuntu `chromium`).
# Idempotent: does nothing when one is found. Without root or sudo it says how to install one;
# only that test needs it.
set -uo pipefail

for b in ${LOOKAHEAD_BROWSER:-} chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then echo "browser: $(command -v "$b")"; exit 0; fi
done

"$(dirname "$0")/apt_install.sh" browser chromium

if command -v chromium >/dev/null 2>&1; then echo "browser: $(command -v chromium)"; exit 0; fi
echo "browser: no chromium found; install it (Debian/Ubuntu: apt-get install chromium) or set LOOKAHEAD_BROWSER" >&2
exit 1
