# OOM Lab: `make start` sets up and starts the course, `make test` sets up and runs the tests.
# Both create their own virtual environment in .venv and install the course into it.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# A CUDA build of torch is several GB, so the environment reuses a torch that is already
# installed (it sees the system's packages). Where there is none, a machine with an NVIDIA
# driver gets the newest CUDA build from PyPI; one without (CI) gets the CPU-only build from
# PyTorch's own index, falling back to PyPI at once where that index cannot be reached.
# `make start TORCH='torch==2.5.1'` installs that torch into .venv, whatever is there already.
TORCH ?= torch==2.13.0
CPU_INDEX := https://download.pytorch.org/whl/cpu
HAS_DRIVER := $(shell command -v nvidia-smi 2>/dev/null)
PIP := $(BIN)/python -m pip install --quiet
# torch is the long download: pip's progress bar shows it (and --quiet would hide it).
PIP_TORCH := $(BIN)/python -m pip install --progress-bar on
SAY_TORCH := echo "Installing torch into $(VENV): the largest download, a few minutes on a slow line."
ifeq ($(origin TORCH),command line)
INSTALL_TORCH := $(SAY_TORCH) && $(PIP_TORCH) "$(TORCH)"
else ifneq ($(HAS_DRIVER),)
INSTALL_TORCH := $(BIN)/python -c "import torch" 2>/dev/null || { $(SAY_TORCH) && $(PIP_TORCH) "torch>=2.4"; }
else
INSTALL_TORCH := $(BIN)/python -c "import torch" 2>/dev/null \
	|| { $(SAY_TORCH) && $(PIP_TORCH) --timeout 10 --retries 0 --index-url $(CPU_INDEX) "$(TORCH)"; } \
	|| $(PIP_TORCH) "$(TORCH)"
endif

.PHONY: start test torch browser lint format docs serve verify equivalence bench figures facts promote viewer-shots clean

# pip compiles what it installs to bytecode, but not the course's own package, installed editable: where
# PYTHONDONTWRITEBYTECODE is set, every process (each measured run, each command the tests start) would
# compile oomlab from source again, so it is compiled once here.
# The pip a new venv gets is the one Python shipped with; a current one resolves the course's hundred-odd
# dependencies in half the time (on CI, 31 s -> 19 s). Where none can be had, the old one installs as well, slower.
$(BIN)/oomlab: pyproject.toml setup.py
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -m pip install --quiet --timeout 10 --retries 0 --upgrade pip 2>/dev/null || echo "pip could not be upgraded: the install takes a little longer"
	$(INSTALL_TORCH)
	@echo "Installing the course and its tools into $(VENV) (a minute or two)…"
	$(PIP) -e ".[dev,docs,nbgrader]"
	$(BIN)/python -m compileall -q oomlab >/dev/null
	touch $@

# A torch named on the command line is installed even when .venv already has one.
torch: $(BIN)/oomlab
ifeq ($(origin TORCH),command line)
	$(INSTALL_TORCH)
endif

start: $(BIN)/oomlab torch
	$(BIN)/oomlab
	@echo
	@echo "oomlab is installed in $(VENV), not on your PATH: run $(BIN)/oomlab, or 'source $(BIN)/activate' once in each shell and then oomlab."

# The project's own tests, the house rules, and the course checked against its manifests
# (on a GPU every seeded bug, fix, wrong fix and cheat is measured; without one those skip).
# PYTEST_JOBS test files run at once (pytest-xdist); each file's tests stay together on one worker,
# so a module's fixture (a built site, a graded class) is made once, and the files marked long go first
# (tests/conftest.py orders them; xdist would otherwise order files by their number of tests).
# Only the plugins the suite uses load (xdist; the course's own comes with conftest.py): the environment sees
# the system's packages, whose pytest plugins (hypothesis, pytest-benchmark, anyio) cost every worker and every
# pytest the tests start seconds of imports for nothing.
PYTEST_JOBS ?= 2
test: $(BIN)/oomlab torch lint browser
	PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 $(BIN)/python -m pytest -p xdist -n $(PYTEST_JOBS) --dist loadfile --no-loadscope-reorder tests graders --solutions

# tests/test_browser.py opens the built site in Debian's headless Chromium. As root with apt-get,
# install it where it is missing (apt-get update only if the install fails without it); elsewhere
# say in one line that the browser test will be skipped, and carry on.
BROWSER_PACKAGES := chromium chromium-driver
APT_INSTALL := DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PACKAGES) >/dev/null
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "browser: no /usr/bin/chromium or /usr/bin/chromedriver and no apt-get: tests/test_browser.py will be skipped"; \
	elif [ "$$(id -u)" != 0 ]; then \
		echo "browser: no /usr/bin/chromium or /usr/bin/chromedriver and not root: tests/test_browser.py will be skipped (sudo apt-get install $(BROWSER_PACKAGES))"; \
	else \
		echo "browser: installing $(BROWSER_PACKAGES) with apt-get for tests/test_browser.py"; \
		$(APT_INSTALL) 2>/dev/null || { apt-get update -qq && $(APT_INSTALL); }; \
	fi

lint: $(BIN)/oomlab
	$(BIN)/ruff check .
	$(BIN)/ruff format --check oomlab tests graders setup.py

format: $(BIN)/oomlab
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format oomlab tests graders setup.py

docs: $(BIN)/oomlab
	$(BIN)/python -m mkdocs build --strict

serve: $(BIN)/oomlab
	$(BIN)/python -m mkdocs serve

# On a GPU: measure every exercise again and rewrite course/measurements/verify.json.
verify: $(BIN)/oomlab
	$(BIN)/oomlab dev verify

# On a GPU: every run both fresh and forked from a warm server, into course/measurements/equivalence.json.
equivalence: $(BIN)/oomlab
	$(BIN)/oomlab dev equivalence

# On a GPU: time what a learner waits for, into course/measurements/speed.json.
bench: $(BIN)/oomlab
	$(BIN)/oomlab dev bench

# On a GPU: redraw the site's pictures into course/figures/.
figures: $(BIN)/oomlab
	$(BIN)/oomlab dev figures

# On a GPU: bring new exercises (drafts moved into their modules in exercises/modules.toml) into the course's reports:
# their budgets sized and written into their manifests, every run of theirs measured fresh and forked (their rows of
# equivalence.json and verify.json; the other exercises' rows are kept), their figures, the probes new or changed
# since facts.json, and the README's figures.   make promote EXERCISES="resume-checkpoint eval-predictions"
EXERCISES ?=
promote: $(BIN)/oomlab
	@if [ -z "$(EXERCISES)" ]; then echo 'promote: name them, EXERCISES="ID ..."'; exit 2; fi
	$(BIN)/oomlab dev calibrate --write $(EXERCISES)
	$(BIN)/oomlab dev equivalence $(addprefix --exercise ,$(EXERCISES)) --verify-json course/measurements/verify.json
	$(BIN)/oomlab dev figures $(addprefix --exercise ,$(EXERCISES))
	$(BIN)/oomlab dev facts --stale
	$(BIN)/oomlab dev readme
# On a GPU: run the probes in course/probes/ and rewrite course/measurements/facts.json.
facts: $(BIN)/oomlab
	$(BIN)/oomlab dev facts

# No GPU: PyTorch's memory viewer on the committed snapshots, in headless Chromium, into course/figures/.
# Neither input is in the project (see the README): make viewer-shots MEMORY_VIZ=path/MemoryViz.js D3=path/node_modules
MEMORY_VIZ ?=
D3 ?=
viewer-shots: $(BIN)/oomlab
	@if [ -z "$(MEMORY_VIZ)" ] || [ -z "$(D3)" ]; then \
		echo "viewer-shots: give MEMORY_VIZ=path/to/MemoryViz.js and D3=path/to/node_modules (see the README)"; exit 2; fi
	$(BIN)/oomlab dev viewer-shots --memory-viz "$(MEMORY_VIZ)" --d3 "$(D3)"

clean:
	rm -rf $(VENV) site build  # never .oomlab: it keeps your backups
