# The two commands a newcomer types: `make run` (set up, then run the main job on embedded
# defaults: `rollout demo`) and `make test` (set up, then lint, type-check and run the tests).
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp

.PHONY: setup run test lint typecheck pytest clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	@touch $(STAMP)

run: setup
	$(BIN)/rollout demo --work-dir runs/demo --json runs/demo/summary.json

test: setup lint typecheck pytest

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck:
	$(BIN)/mypy

pytest:
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
