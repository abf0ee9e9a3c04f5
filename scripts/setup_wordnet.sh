#!/usr/bin/env bash
# Make WordNet 3.0 readable by nltk (docs/install.md). Idempotent: does nothing when it is found already.
#   1. Debian/Ubuntu packages wordnet-base + wordnet-sense-index, when apt-get can install them;
#   2. otherwise nltk's downloader (needs network access to nltk's data);
#   3. otherwise the error of `python -m lookahead.semantics.wordnet_source`, naming both routes.
set -uo pipefail
PY=${1:-python}

if found=$("$PY" -m lookahead.semantics.wordnet_source 2>/dev/null); then
  echo "$found"
  exit 0
fi

"$(dirname "$0")/apt_install.sh" WordNet wordnet-base wordnet-sense-index

if ! "$PY" -m lookahead.semantics.wordnet_source >/dev/null 2>&1; then
  echo "WordNet: trying nltk.download('wordnet')"
  "$PY" -c "import nltk, sys; sys.exit(0 if nltk.download('wordnet', quiet=True, raise_on_error=True) else 1)" \
    >/dev/null 2>&1 || echo "WordNet: nltk's downloader failed"
fi

"$PY" -m lookahead.semantics.wordnet_source
