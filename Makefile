# The two commands a new user runs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export PYSPARK_PYTHON := $(CURDIR)/$(BIN)/python

.PHONY: run cluster test test-fast bytecode lint bench clean s3-deps spark-deps browser-deps console-screenshot

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The server depends on the client's own distribution (segstore-client), installed from its folder.
CLIENT := clients/python
PROJECTS := pyproject.toml $(CLIENT)/pyproject.toml

# Serving needs only the runtime dependencies.
$(VENV)/.serve: $(PROJECTS) | $(BIN)/activate
	$(BIN)/pip install --quiet -e $(CLIENT) -e .
	touch $@

# Optional extras: moto's S3 server (s3), the PySpark data source (spark). `test` has both.
$(VENV)/.s3: $(PROJECTS) | $(BIN)/activate
	$(BIN)/pip install --quiet -e $(CLIENT) -e '.[s3]'
	touch $@ $(VENV)/.serve

$(VENV)/.spark: $(PROJECTS) | $(BIN)/activate
	$(BIN)/pip install --quiet -e '$(CLIENT)[spark]' -e '.[spark]'
	touch $@ $(VENV)/.serve

$(VENV)/.test: $(PROJECTS) | $(BIN)/activate
	$(BIN)/pip install --quiet -e '$(CLIENT)[spark]' -e '.[test]'
	touch $@ $(VENV)/.serve $(VENV)/.s3 $(VENV)/.spark

s3-deps: $(VENV)/.s3

spark-deps: $(VENV)/.spark

run: $(VENV)/.serve
	$(BIN)/python -m gunicorn -c deploy/gunicorn.conf.py 'app:create_app()'

# moto (S3 on loopback, port 5000) and three nodes on ports 8080-8082 sharing its bucket; Ctrl-C stops all.
cluster: $(VENV)/.s3
	$(BIN)/python -m bench.local_cluster

lint: $(VENV)/.test
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# The console's browser tests drive Debian's Chromium: installed with apt when missing (sudo unless root).
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)
browser-deps:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	else $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium chromium-driver; fi

# docs/console.png, the README's picture of the console: a node with sample data, photographed.
console-screenshot: $(VENV)/.test browser-deps
	$(BIN)/python -m bench.console docs/console.png

# The project's own modules, compiled before a run: the suite starts some hundreds of Python
# processes (servers and their workers, Spark's Python workers, command lines), and where bytecode
# is not written (PYTHONDONTWRITEBYTECODE) each would compile them anew, a third of a second a start.
SOURCES := app engine bench tests $(CLIENT)/client
bytecode: $(VENV)/.test
	$(BIN)/python -m compileall -q $(SOURCES)

# Three workers on two cores (many tests wait on leases and timeouts more than they compute), each
# taking a whole module of the tests that start processes at a time (tests/conftest.py); the slowest
# tests are named at the end, to keep the suite within 15 minutes.
test: lint browser-deps bytecode
	$(BIN)/pytest -q -n 3 --dist loadgroup --durations=25

# The tests that start no process (tests/conftest.py), two at a time: about two minutes, for the edit-test loop.
test-fast: bytecode
	$(BIN)/pytest -q -m "not process" -n 2

bench: $(VENV)/.serve
	$(BIN)/python -m bench.appends

clean:
	rm -rf $(VENV) build *.egg-info $(CLIENT)/build $(CLIENT)/*.egg-info
