# The two commands: `make run` (the whole console, embedded defaults) and `make test` (the suite).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint mypy mypy-baseline migrate clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# torch is pinned in pyproject (==2.13.0, the CPU build on this kind of machine).
$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev,ml,agent,deploy]'
	touch $(STAMP)

migrate: $(STAMP)
	$(PY) manage.py migrate --noinput

run: migrate
	$(PY) manage.py bootstrap_console
	@echo "Console: http://$${CONSOLE_HOST:-127.0.0.1}:$${CONSOLE_PORT:-8000}  (admin at /admin/, API docs at /api/docs/)"
	$(VENV)/bin/honcho start -f Procfile

test: $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(MAKE) mypy

# Types ([tool.mypy] in pyproject): fails on any error not in mypy-baseline.txt. apps/scheduling and workers/
# are checked strictly. Fixed errors leave the baseline: `make mypy-baseline` rewrites it, and refuses to
# add errors to it unless MYPY_BASELINE_GROW=1.
MYPY_OUT := var/mypy.txt

mypy: $(STAMP)
	@mkdir -p var
	@$(VENV)/bin/mypy > $(MYPY_OUT); rc=$$?; [ $$rc -le 1 ] || { cat $(MYPY_OUT); exit $$rc; }
	$(VENV)/bin/mypy-baseline filter --allow-unsynced --no-colors --ignore-categories note < $(MYPY_OUT)

mypy-baseline: $(STAMP)
	@mkdir -p var
	@$(VENV)/bin/mypy > $(MYPY_OUT); rc=$$?; [ $$rc -le 1 ] || { cat $(MYPY_OUT); exit $$rc; }
	@if [ "$${MYPY_BASELINE_GROW:-0}" != 1 ] && ! $(VENV)/bin/mypy-baseline filter --allow-unsynced --no-colors --ignore-categories note \
	    --hide-stats < $(MYPY_OUT) > /dev/null; then \
	  echo "mypy-baseline.txt only shrinks: fix the new errors (make mypy lists them), or MYPY_BASELINE_GROW=1"; \
	  exit 1; fi
	$(VENV)/bin/mypy-baseline sync --sort-baseline --ignore-categories note < $(MYPY_OUT)

clean:
	rm -rf var .pytest_cache
