# is-study: `make run` installs and runs the main job; `make test` installs and runs the tests.
PYTHON ?= python3
PIP := $(PYTHON) -m pip

.PHONY: install run test bench figures gallery mutation clean

# torch first, pinned: here `torch==2.13.0` is a local CPU wheel, while a bare `torch` would pull
# a multi-GB CUDA build. pyproject.toml keeps a range (torch>=2.3) for users elsewhere.
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'

run: install
	is-study run correction=seq-mask-tis

test: install
	$(PYTHON) -m pytest

bench: install
	$(PYTHON) scripts/bench.py

figures: install
	bash scripts/figures.sh

gallery: install
	bash scripts/make_gallery.sh

# Mutation testing (mutmut) of the maths, worlds, probe statistics and claim rules; not run in CI.
# Slow: GROUPS="corrections losses" narrows it; scripts/mutation.py says how it is scored.
mutation: install
	$(PIP) install -q -e '.[mutation]'
	$(PYTHON) scripts/mutation.py run $(GROUPS)

clean:
	rm -rf runs multirun outputs .pytest_cache .hypothesis audit-cases bench.json mutants
