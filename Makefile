# One command to set up and run the embedded default, one to set up and test.
#   make run    venv + install + prepare → warm-up → embed → label → fit predictor → train grpo, dots_rr → compare
#   make test   venv + install + pytest
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install run test clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# pip 23 can hang for minutes resolving this dependency set; pip >= 26 does it in about two.
	$(BIN)/python -m pip install -q --upgrade "pip>=26"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/.installed

run: install
	$(BIN)/dots all

test: install
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf artifacts results
