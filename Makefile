# The two commands a newcomer types: `make run` (set up, then run the main job on embedded
# defaults: `rollout demo`) and `make test` (set up, then lint, type-check and run the tests).
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
# Python writes its byte code caches in this checkout and its venv, whatever the caller's environment says:
# with PYTHONDONTWRITEBYTECODE set, every service process the suite starts compiled the platform's
# modules from source again, and each pytest worker re-rewrote every test module (the venv's packages
# are compiled at their first import too: scripts/setup.sh installs them with --no-compile).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup run test checks lint typecheck pytest clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	@touch $(STAMP)

run: setup
	$(BIN)/rollout demo --work-dir runs/demo --json runs/demo/summary.json

# lint and typecheck (about a minute of one core, mostly mypy) run beside the tests; their output is
# printed in one piece when they end, pytest's as it comes; either failing fails `make test` once the
# other ends
test: setup
	@$(MAKE) --no-print-directory -j2 checks pytest

checks:
	@$(MAKE) --no-print-directory lint typecheck > $(VENV)/checks.log 2>&1; rc=$$?; cat $(VENV)/checks.log; exit $$rc

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy's cache lives beside uv's, outside the checkout: a fresh clone's check then reads the modules it
# checked before (a file whose time changed is compared by its hash, so a changed one is checked again):
# 1 s instead of 41 s of one core, which `make test` spends beside the tests. `make clean` keeps it.
MYPY_CACHE ?= $(HOME)/.cache/rollout/mypy
typecheck:
	$(BIN)/mypy --cache-dir $(MYPY_CACHE)

# The suite in PYTEST_WORKERS processes, a test file per process at a time (module-scoped fleets start
# once; each process has its own Redis, ports and tmp dirs; the files with the longest tests first, as
# tests/conftest.py orders them: without --no-loadscope-reorder xdist sends the files with the most tests
# first, and the few-test files that take minutes each then ran last, alone). The tests on private
# dockerds run among the others: until the egress fix of 2026-12-06 (slirp4netns in a private mount
# namespace) they ran after them, because an egress sandbox's slirp4netns unmounted every running
# container's root filesystem on the host (exec then failed with "unable to find user root").
# A failed test runs once more (pytest-rerunfailures) and is listed as RERUN in the summary: four
# fresh-clone runs each failed a different test once (a port race, a readmission race, a container
# list race, a chaos scenario's 120 s wait), the first three fixed; PYTEST_RERUNS=0 turns it off. The
# first attempt's traceback is printed in the rerun summary (--rerun-show-tracebacks): without it a test
# that passed on its rerun left no trace of what failed.
# Each pytest process starts its services (API, worker, proxy, broker, engines: hundreds per run) by
# forking them from a server that has imported their libraries already (services/runtime/forkserver.py,
# tests/conftest.py): that import was most of a start's CPU, and the suite is CPU-bound on 2 cores.
# ROLLOUT_TEST_FORKSERVER=0 execs each service instead.
# Five on 2 cores, not four: in the second half of a run the tests wait (outages, keep-alives, sandboxes,
# trainer ranks) and four left 13-20% of the CPU idle; five took pytest from 707 to 613 s on the same
# host and caches (2026-12-08, CPU 1006 and 996 s in all).
PYTEST_WORKERS ?= 5
PYTEST_RERUNS ?= 1
# Beside the tests, the platform's images are built into their cache (tests/support/prebuild_images.py,
# nothing when they are there already), so that the compose test only loads them (scripts/build-images.sh
# takes a lock on the cache: a compose test that starts first waits for that build instead of making
# its own). On a fresh machine that build was 110 s of the compose test. Its log's last line is printed
# at the end; where it could not build them, the compose test does, as before.
PREBUILD_LOG := $(VENV)/prebuild-images.log
pytest:
	$(BIN)/python -m tests.support.prebuild_images > $(PREBUILD_LOG) 2>&1 & prebuild=$$!; \
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --reruns $(PYTEST_RERUNS) --rerun-show-tracebacks; \
	rc=$$?; wait $$prebuild; echo "== images built beside the tests: $$(tail -1 $(PREBUILD_LOG))"; exit $$rc

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
