# DeFL: two commands set a fresh machine up. `make demo` runs the main job, `make test` the tests.
# Both are idempotent: each step re-runs only when its inputs changed.
SHELL := /bin/bash
PY := .venv/bin/python
STAMPS := .stamps

.PHONY: demo test test-fast lint setup bench clean

setup: $(STAMPS)/system $(STAMPS)/venv $(STAMPS)/npm frontend/dist/index.html

$(STAMPS)/system: scripts/system-deps.sh
	@mkdir -p $(STAMPS)
	bash scripts/system-deps.sh
	touch $@

$(STAMPS)/venv: requirements.txt requirements-dev.txt pyproject.toml $(STAMPS)/system
	@mkdir -p $(STAMPS)
	test -x $(PY) || python3 -m venv .venv
	# torch is pinned to the local CPU wheel; installed first so nothing can pull a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -r requirements-dev.txt
	# The project's own package: the `defl` command-line client (pyproject.toml [project.scripts]).
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	touch $@

$(STAMPS)/npm: package.json package-lock.json
	@mkdir -p $(STAMPS)
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

$(STAMPS)/frontend-npm: frontend/package.json frontend/package-lock.json
	@mkdir -p $(STAMPS)
	npm ci --prefix frontend --no-audit --no-fund --loglevel=error
	touch $@

# The dashboard's build, served by every node (rebuilt when its sources change).
frontend/dist/index.html: $(STAMPS)/frontend-npm frontend/index.html frontend/vite.config.js $(shell find frontend/src -type f 2>/dev/null)
	npm --prefix frontend run build

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	node contracts/compile.mjs --check

# Everything, as CI runs it (.ci/run): lint, the dashboard's Vitest tests, all of pytest.
test: setup lint
	npm --prefix frontend test
	$(PY) -m pytest -n 2 --dist loadfile -p no:cacheprovider --durations=30 $(PYTEST_ARGS)

# Every day: the unit and in-process tests, no lint (a few minutes on 2 cores). Left out: node
# processes (e2e), Chromium (browser), MariaDB / Redis / a chain (integration), and the tests that
# take more than a few seconds (slow); `make test` runs those.
FAST_MARKS := not e2e and not browser and not integration and not slow
test-fast: setup
	$(PY) -m pytest -n 2 --dist loadfile -p no:cacheprovider -m "$(FAST_MARKS)" --durations=10 $(PYTEST_ARGS)

# The main job: a local federation (anvil, contracts, three node processes) training with DP.
demo: setup
	$(PY) -m devnet.demo $(DEMO_ARGS)

clean:
	rm -rf $(STAMPS) out var
