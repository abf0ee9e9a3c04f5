#!/usr/bin/env bash
# Make WordNet 3.0 readable by nltk (DESIGN §5). Idempotent: does nothing when it is found already.
#   1. Debian/Ubuntu packages wordnet-base + wordnet-sense-index, when apt-get can install them;
#   2. otherwise nltk's downloader (needs network access to nltk's data);
#   3. otherwise the error of `python -m lookahead.wordnet_data`, naming both routes.
set -uo pipefail
PY=${1:-python}

if found=$("$PY" -m lookahead.wordnet_data 2>/dev/null); then
  echo "$found"
  exit 0
fi

if command -v apt-get >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" = 0 ] || { command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null && SUDO="sudo -n"; }
  if [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; then
    echo "WordNet: installing Debian packages wordnet-base wordnet-sense-index"
    $SUDO apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
           wordnet-base wordnet-sense-index >/dev/null \
      || echo "WordNet: apt-get could not install the packages"
  fi
fi

if ! "$PY" -m lookahead.wordnet_data >/dev/null 2>&1; then
  echo "WordNet: trying nltk.download('wordnet')"
  "$PY" -c "import nltk, sys; sys.exit(0 if nltk.download('wordnet', quiet=True, raise_on_error=True) else 1)" \
    >/dev/null 2>&1 || echo "WordNet: nltk's downloader failed"
fi

"$PY" -m lookahead.wordnet_data
