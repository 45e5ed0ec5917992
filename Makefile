# rlvrlab's two entry points: `make run` (the default experiment) and `make test` (the test suite).
# Both create .venv on first use and reinstall when pyproject.toml changes.

VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install run test

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned to the CPU build: an unpinned `torch` resolves to a multi-GB CUDA build
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Shows the resolved default experiment; `rlvrlab train` replaces this once the training loop lands.
run: $(STAMP)
	$(BIN)/rlvrlab config show

test: $(STAMP)
	$(BIN)/pytest -q
