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

.PHONY: start test docs serve verify clean

$(BIN)/oomlab: pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[dev,docs]"
	touch $@

start: $(BIN)/oomlab
	$(BIN)/oomlab

test: $(BIN)/oomlab
	$(BIN)/python -m pytest tests graders --solutions

docs: $(BIN)/oomlab
	$(BIN)/python -m mkdocs build --strict

serve: $(BIN)/oomlab
	$(BIN)/python -m mkdocs serve

# On a GPU: measure every exercise again and rewrite the committed report.
verify: $(BIN)/oomlab
	$(BIN)/oomlab verify --json course/measurements/verify.json

clean:
	rm -rf $(VENV) site  # never .oomlab: it keeps your backups
