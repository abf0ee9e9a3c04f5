#!/usr/bin/env bash
# apt_install.sh WHAT PACKAGE...: install Debian/Ubuntu packages when apt-get can run as root or with
# password-less sudo; otherwise, or when apt-get fails, say so and return 1 (the caller decides).
set -uo pipefail
what=$1; shift
command -v apt-get >/dev/null 2>&1 || exit 1
SUDO=""
[ "$(id -u)" = 0 ] || { command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && SUDO="sudo -n"; }
[ "$(id -u)" = 0 ] || [ -n "$SUDO" ] || exit 1
echo "$what: installing Debian packages $*"
$SUDO apt-get update -qq \
  && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null \
  || { echo "$what: apt-get could not install $*"; exit 1; }
