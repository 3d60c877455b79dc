# OOM Lab: `make start` sets up and starts the course, `make test` sets up and runs the tests.
# Both create their own virtual environment in .venv and install the course into it.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

# A CUDA build of torch is several GB, so the environment reuses a torch that is already
# installed (it sees the system's packages). Where there is none, a machine with an NVIDIA
# driver gets the newest CUDA build; one without (CI) gets the CPU-only test setup pinned here.
# Override with `make start TORCH='torch==2.5.1'`.
TORCH ?= $(if $(shell command -v nvidia-smi 2>/dev/null),torch>=2.4,torch==2.13.0)

.PHONY: start test lint format docs serve verify figures clean

$(BIN)/oomlab: pyproject.toml setup.py
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev,docs]"
	touch $@

start: $(BIN)/oomlab
	$(BIN)/oomlab

# The project's own tests, the house rules, and the course checked against its manifests
# (on a GPU every seeded bug, fix, wrong fix and cheat is measured; without one those skip).
test: $(BIN)/oomlab lint
	$(BIN)/python -m pytest tests graders --solutions

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

# On a GPU: redraw the site's pictures into course/figures/.
figures: $(BIN)/oomlab
	$(BIN)/oomlab dev figures

clean:
	rm -rf $(VENV) site build  # never .oomlab: it keeps your backups
