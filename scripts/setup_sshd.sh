#!/usr/bin/env bash
# OpenSSH's server, for the test that shares the pipeline through a real SSH remote on loopback
# (Debian/Ubuntu `openssh-server`). Idempotent: does nothing when sshd is found. Only that test needs it.
set -uo pipefail

for s in sshd /usr/sbin/sshd; do
  if command -v "$s" >/dev/null 2>&1; then echo "sshd: $(command -v "$s")"; exit 0; fi
done

"$(dirname "$0")/apt_install.sh" sshd openssh-server

if [ -x /usr/sbin/sshd ]; then echo "sshd: /usr/sbin/sshd"; exit 0; fi
echo "sshd: not found; install it (Debian/Ubuntu: apt-get install openssh-server)" >&2
exit 1
