# Set-up and entry points. `make repro` and `make test` each set up everything they need first
# (virtualenv, package, WordNet); both are idempotent: a second call reinstalls nothing.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Stage commands in dvc.yaml call `python`: make it the virtualenv's.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup wordnet repro test bench check-params clean

setup: $(STAMP) wordnet

# torch: the CPU build 2.13.0 where that file is available (it installs in seconds), the ordinary
# install elsewhere; the package's own `torch>=2.4` is then already satisfied.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check torch==2.13.0 \
	  || $(BIN)/python -m pip install --quiet --disable-pip-version-check 'torch>=2.4'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $@

wordnet: $(STAMP)
	scripts/setup_wordnet.sh $(BIN)/python

check-params: $(STAMP)
	$(BIN)/python -m lookahead.config params.yaml

repro: setup check-params
	$(BIN)/dvc repro

test: setup
	$(BIN)/python -m pytest -q

bench: setup
	@for b in benchmarks/*.py; do $(BIN)/python $$b; done

clean:
	rm -rf $(VENV) .nltk_data checkpoints
