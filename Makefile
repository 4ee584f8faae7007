# `make run`: the demo at http://127.0.0.1:8000/ (PORT=8001 for another port)   `make test`: the whole suite (docs build included)
# `make test-matrix`: the suite on the other Djangos and Pythons (nox, noxfile.py), the exactness tests on Redis 6.2 and 8
# `make docs`: the documentation in docs/_build/html (warnings are errors)   `make bench`: benchmarks
# Each bootstraps .venv itself; without REDIS_URL a private Redis-compatible server is started and stopped.
# The suite runs in PYTEST_WORKERS processes (pytest-xdist), each with a private server and database of its own.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
WITH_REDIS := $(BIN)/python -m project.devredis --
PORT ?= 8000
# Four on two cores: many tests mostly wait on servers they start (with three, a quiet run of 390 s on two cores
# counted ~450 CPU s of tests: the cores were idle a third of it). noxfile.py runs its sessions with the same.
PYTEST_WORKERS ?= 5
# A run starts dozens of Python processes (workers, servers, nested runs, commands), and without cached bytecode
# each compiles Django and the app again (~1.5 s of CPU; 8 s a pytest worker). Where PYTHONDONTWRITEBYTECODE
# keeps __pycache__ out of the tree, the bytecode is cached in var/pycache instead.
ifneq ($(PYTHONDONTWRITEBYTECODE),)
unexport PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX ?= $(CURDIR)/var/pycache
endif

.PHONY: run test test-matrix test-newest docs bench clean

# uv installs the same pinned requirements as pip, in a third of the time here (noxfile.py's sessions use
# it too); where uv cannot be installed, pip does it.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	-$(BIN)/pip install -q uv
INSTALL = if $(BIN)/python -m uv --version >/dev/null 2>&1; \
	then $(BIN)/python -m uv pip install -q --python $(BIN)/python $(1); else $(BIN)/pip install -q $(1); fi

$(VENV)/.runtime: requirements.txt | $(BIN)/python
	$(call INSTALL,-r requirements.txt)
	touch $@

$(VENV)/.dev: requirements-dev.txt $(VENV)/.runtime
	$(call INSTALL,-r requirements-dev.txt)
	touch $@

$(VENV)/.bench: bench/requirements.txt $(VENV)/.dev
	$(call INSTALL,-r bench/requirements.txt)
	touch $@

run: $(VENV)/.runtime
	$(WITH_REDIS) sh -c '$(BIN)/python manage.py migrate --noinput && \
		$(BIN)/python manage.py demo_setup --port $(PORT) && \
		exec $(BIN)/python manage.py runserver --noreload 127.0.0.1:$(PORT)'

test: $(VENV)/.dev
	scripts/ensure-chromium
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-matrix: $(VENV)/.dev
	scripts/ensure-chromium
	$(BIN)/nox $(NOX_ARGS)

# The newest combination only (Python 3.13, Django 6.1): what CI runs beside `make test`
test-newest: $(VENV)/.dev
	scripts/ensure-chromium
	$(BIN)/nox -s "tests(3.13-django6.1)" $(NOX_ARGS)

docs: $(VENV)/.dev
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "The documentation is in docs/_build/html/index.html"

# then the instructions the worker runs per request (valgrind's callgrind; skipped, saying so, without valgrind)
bench: $(VENV)/.bench
	$(WITH_REDIS) $(BIN)/python -m bench $(BENCH_ARGS)
	$(WITH_REDIS) $(BIN)/python -m bench.request_instructions --write bench/RESULTS.md

clean:
	rm -rf $(VENV) .nox var docs/_build
