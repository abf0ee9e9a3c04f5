#!/usr/bin/env bash
# A headless browser for the test that renders the offline plots page (Debian/Ubuntu `chromium`).
# Idempotent: does nothing when one is found. Without root or sudo it says how to install one;
# only that test needs it.
set -uo pipefail

for b in chromium chromium-browser google-chrome; do
  if command -v "$b" >/dev/null 2>&1; then echo "browser: $(command -v "$b")"; exit 0; fi
done

if command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && SUDO="sudo -n"; }
  if [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; then
    echo "browser: installing the Debian package chromium"
    $SUDO apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null \
      || echo "browser: apt-get could not install chromium"
  fi
fi

if command -v chromium >/dev/null 2>&1; then echo "browser: $(command -v chromium)"; exit 0; fi
echo "browser: no chromium found; install it (Debian/Ubuntu: apt-get install chromium) or set LOOKAHEAD_BROWSER" >&2
exit 1
