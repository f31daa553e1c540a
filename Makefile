# Tandem: `make run` starts everything, `make test` runs every test. Both set up what they need.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
export DEBUG ?= 1
export PATH := $(BIN):$(PATH)
export PYTHONUNBUFFERED := 1

.PHONY: run run-split test chaos soak setup venv redis migrate lint lock model compile bench bench-docs clean-venv vendor screenshots

run: setup model
	@$(BIN)/python manage.py create_dev_login
	@echo
	@echo "  Tandem is starting: http://127.0.0.1:$${TANDEM_PORT:-8000}   login: demo / demo"
	@echo "  (web = daphne, worker = celery -Q media, beat = celery beat; Ctrl-C stops all)"
	@echo
	$(BIN)/honcho start

# Web ×WEB behind one engine box (docs/deploy.md): web on 8001…, the engine on 8101.
WEB ?= 3
run-split: setup model
	@$(BIN)/python manage.py create_dev_login
	@echo
	@echo "  Tandem: $(WEB) web processes on 127.0.0.1:8001.. and one engine on :8101 (docs/deploy.md)"
	@echo
	$(BIN)/honcho -f Procfile.split start -c web=$(WEB) -p 8001

# The suite uses Redis database 15 so that a `make run` on database 0 never shares its queues.
# `make test` is every test: the ordinary ones, then the chaos scenarios (each run once).
test chaos: export REDIS_URL ?= redis://127.0.0.1:6379/15
test: setup
	$(BIN)/pytest -m "not chaos"
	$(CHAOS)

# Fault scenarios with figures: worker kills, Redis outage, web restart, overload, PostgreSQL
# outage (replies streaming; images rendering), an unwritable media folder. Each writes
# var/reliability/<scenario>.json; docs/reliability.md explains them and quotes the last run.
CHAOS = $(BIN)/pytest -m chaos
chaos: setup
	$(CHAOS)

setup: venv redis migrate

venv: $(STAMP)

# Every package comes from the lock, pinned and checked against its hash (`make lock` remakes it).
$(STAMP): requirements.txt requirements-model.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements.txt
	$(BIN)/python -m pip install --quiet --no-deps --require-hashes -r requirements-model.txt
	@touch $@

# requirements.in (direct dependencies) -> requirements.txt (all of them, with hashes).
lock: venv
	$(BIN)/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe \
		--no-emit-index-url --no-emit-find-links -o requirements.txt requirements.in

redis: venv
	@$(BIN)/python -m config.ensure_redis

migrate: venv
	@$(BIN)/python manage.py migrate --noinput

# Converts the packaged model on first use (about 40 s once; later loads take about a second).
model: venv
	@$(BIN)/python manage.py model_info

# Builds the compiled step's buckets into TANDEM_COMPILE_CACHE once (~15 min on 2 cores), so
# that every later start loads them in seconds; without it the first start builds them while
# it serves.
compile: setup model
	$(BIN)/python manage.py compile_model

# The engine against its peers, same prompts and dtype (docs/benchmarks.md); BENCH_ARGS=--quick.
bench: venv
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	$(BIN)/python -m bench.engine $(BENCH_ARGS)

# docs/benchmarks.md's tables, remade from the runs kept in bench/results/kept/ (`--keep`).
bench-docs: venv
	$(BIN)/python -m bench.results_page

# Mixed load on a stack of its own for MINUTES (not in CI); resources sampled every 10 s, bars
# checked, var/soak/<timestamp>.json and .png written (docs/reliability.md).
MINUTES ?= 30
soak: setup
	$(BIN)/python -m pip install --quiet -r requirements-bench.txt
	nice -n 5 $(BIN)/python -m bench.soak --minutes $(MINUTES)

# The browser libraries (markdown-it, DOMPurify, highlight.js; axe-core for the tests) at the
# exact versions in scripts/vendor_js.sh, from the npm registry into static/vendor/ (committed).
vendor:
	scripts/vendor_js.sh

# The README's screenshots, on a stack of its own (Daphne with the model, a worker whose images
# all fail); not part of `make test`. Writes docs/screenshots/*.png.
screenshots: setup model
	$(BIN)/python -m tests.support.screenshots

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean-venv:
	rm -rf $(VENV)
