# is-study: `make run` installs and runs the main job; `make test` installs and runs the tests;
# `make test-fast` runs all but the tests marked slow; `make lint` runs ruff's lint and format checks.
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install run test test-fast lint bench figures gallery mutation clean FORCE

# pip runs once per Python environment, not on every target: .make/installed-KEY (KEY: a hash of
# the environment's sys.prefix) is remade when pyproject.toml is newer, when the environment's
# site-packages changed after it (a fresh venv, a venv recreated at the same path, packages added or
# removed since), or when is-study is not installed there editable from this checkout. A
# site-packages folder that does not exist yet (a system Python's) or has a space in its path
# (make cannot name it) is left out of the check.
ENV_KEY := $(shell $(PYTHON) -c 'import hashlib, sys; print(hashlib.sha256(sys.prefix.encode()).hexdigest()[:12])')
SITE_PACKAGES := $(shell $(PYTHON) -c 'import os, sysconfig; p = sysconfig.get_paths()["purelib"]; \
	print(p if os.path.isdir(p) and " " not in p else "")')
INSTALLED_HERE := $(shell $(PYTHON) -c 'import importlib.metadata as m, json, pathlib; \
	d = m.distribution("is-study"); \
	print("yes" if json.loads(d.read_text("direct_url.json") or "{}").get("url") == pathlib.Path.cwd().as_uri() else "")' 2>/dev/null)
STAMP := .make/installed-$(ENV_KEY)
# the extras `make install` brings: `make test EXTRAS=test,tracking` adds the trackers' packages (CI does)
EXTRAS ?= test

install: $(STAMP)

FORCE:

# torch first, pinned: here `torch==2.13.0` is a local CPU wheel, while a bare `torch` would pull
# a multi-GB CUDA build. pyproject.toml keeps a range (torch>=2.3) for users elsewhere.
$(STAMP): pyproject.toml $(SITE_PACKAGES) $(if $(INSTALLED_HERE),,FORCE)
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[$(EXTRAS)]'
	@mkdir -p .make && touch $@

run: install
	is-study run correction=seq-mask-tis

test: install
	$(PYTHON) -m pytest

# the tests not marked slow (pyproject.toml's pytest markers say what slow means)
test-fast: install
	$(PYTHON) -m pytest -m "not slow"

# ruff comes with the test extra, pinned: another ruff version formats differently
lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

bench: install
	$(PYTHON) scripts/bench.py

figures: install
	bash scripts/figures.sh

gallery: install
	bash scripts/make_gallery.sh

# Mutation testing (mutmut) of the maths, worlds, probe statistics and claim rules; not run in CI.
# Slow: GROUPS="corrections losses" narrows it; scripts/mutation.py says how it is scored.
mutation: $(STAMP)-mutation
	$(PYTHON) scripts/mutation.py run $(GROUPS)

# both stamps are touched: this install changes site-packages, which would otherwise outdate the first
$(STAMP)-mutation: pyproject.toml $(SITE_PACKAGES) $(if $(INSTALLED_HERE),,FORCE)
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,mutation]'
	@mkdir -p .make && touch $(STAMP) $@

clean:
	rm -rf .make runs multirun outputs .pytest_cache .ruff_cache .hypothesis audit-cases bench.json mutants
