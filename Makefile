# The two commands: `make run` (the whole console, embedded defaults) and `make test` (the suite).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint migrate clean

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
	@echo "Console: http://127.0.0.1:$${CONSOLE_PORT:-8000}  (admin at /admin/, API docs at /api/docs/)"
	$(VENV)/bin/honcho start -f Procfile

test: $(STAMP)
	$(VENV)/bin/pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

clean:
	rm -rf var .pytest_cache
