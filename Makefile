# Two set-up commands: `make train` runs the main job, `make test` runs CI's checks. Each makes the
# virtual environment on first use and installs the project into it as the README's quick start does
# (PyTorch's CPU build first when no GPU is present, then `pip install -e ".[dev]"`); later calls reuse
# it until pyproject.toml changes.
#
#   make train                                    # GRPO on 4x4 Sudoku with the embedded model
#   make train ARGS="trainer.max_steps=4"         # Hydra overrides for src/train.py (last one wins)
#   make test                                     # ruff, mypy, pytest (fast tier)
#   make test PYTEST_ARGS="tests/unit/core/test_config.py -q"
#   make test VENV=/tmp/venv                      # another environment (.ci/run: a fresh one)
#   make test TORCH_INDEX_URL=                    # torch from pip's own indexes (no CPU index)
#   make clean-venv                               # remove the environment

VENV ?= .venv
PYTHON ?= python3
ARGS ?=
PYTEST_ARGS ?=
# the README's CPU index; a plain `pip install torch` on Linux pulls the CUDA build (several GB)
TORCH_INDEX_URL ?= https://download.pytorch.org/whl/cpu
# torch's pin, read from pyproject.toml so the two cannot drift apart
TORCH_SPEC := $(shell sed -n 's/^ *"\(torch[<>=!~][^"]*\)".*/\1/p' pyproject.toml)
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
CPU_TORCH_INDEX := $(if $(HAS_GPU),,$(TORCH_INDEX_URL))  # empty: torch comes with the project

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test install clean-venv

train: $(STAMP)
	$(BIN)/python src/train.py objective=grpo task=sudoku $(ARGS)

# the checks of .ci/run, in its order
test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/pytest $(PYTEST_ARGS)

install: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# the stamp lives inside the environment: removing it, or editing pyproject.toml, reinstalls
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
ifneq ($(strip $(CPU_TORCH_INDEX)),)
	$(BIN)/python -m pip install -q --retries 1 --timeout 15 "$(TORCH_SPEC)" --index-url $(strip $(CPU_TORCH_INDEX)) \
	  || echo "PyTorch's CPU index is out of reach: torch comes from pip's own indexes (a local wheel, or PyPI's build)"
endif
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

clean-venv:
	rm -rf $(VENV)
