# Every target installs on first use: the stamp is rebuilt when the dependencies change.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test test-all test-fast test-real test-cuda check-install lint demo chat doctor bench-memory bench-planner bench-real tiny-model sft-qwen dpo-qwen foodpo-qwen compare-beta-scale

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt scripts/install.sh
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

# The tests run on every core (pytest-xdist; at most 4 workers: each holds the libraries once, about
# 1.5 GB). Modules whose tests share a module's runs stay on one worker (--dist loadgroup).
TEST_WORKERS ?= auto
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --maxprocesses 4 --dist loadgroup

test: $(STAMP)
	$(BIN)/ruff check mpskit tests bench scripts
	$(PYTEST) -m "not slow and not cuda" --durations=25

# Every test, the slow ones too (about twice make test's time); the GPU's apart.
test-all: $(STAMP)
	$(BIN)/ruff check mpskit tests bench scripts
	$(PYTEST) -m "not cuda" --durations=25

# The real tier whole: every test that trains the real model (SmolLM2-135M-Instruct), the slow ones too.
test-real: $(STAMP)
	$(PYTEST) -m real --durations=10

# What only an NVIDIA GPU shows (tests/test_cuda.py): ZeRO-3 over 4-bit QLoRA, FSDP, bitsandbytes' kernels.
test-cuda: $(STAMP)
	$(PYTEST) -m cuda --durations=10

# The unit layer, without the real training runs (marked e2e) and without torch (modules that import it
# as they load run in make test): for the edit-test loop.
test-fast: $(STAMP)
	$(PYTEST) -m "not e2e" --no-torch

# A plain `pip install .` into a new venv that borrows .venv's dependencies, used from outside the
# repository (CI runs it after make test).
check-install: $(STAMP)
	PYTHON=$(PYTHON) bash scripts/check_install.sh

lint: $(STAMP)
	$(BIN)/ruff check mpskit tests bench scripts

tiny-model: $(STAMP)
	$(BIN)/mpskit tiny-model

demo: $(STAMP)
	$(BIN)/mpskit demo

chat: $(STAMP)
	$(BIN)/mpskit chat

doctor: $(STAMP)
	$(BIN)/mpskit doctor

bench-memory: $(STAMP)
	$(BIN)/python bench/memory_accuracy.py

bench-planner: $(STAMP)
	$(BIN)/python bench/planner.py

bench-real: $(STAMP)
	$(BIN)/python bench/real.py

sft-qwen: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/run_sft.sh

dpo-qwen: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/run_dpo.sh

foodpo-qwen: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/test_qwen_foodpo.sh

compare-beta-scale: $(STAMP)
	PATH="$(CURDIR)/$(BIN):$$PATH" bash scripts/compare_foodpo_beta_scale.sh
