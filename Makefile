# One command to set up and run the embedded default, one to set up and test.
#   make run    venv + install + the Prefect pipeline flow over the DVC stages:
#               prepare → warm-up → embed → label → fit predictor → train grpo, dots_rr → compare
#   make test   venv + install + pytest
#   make bench  grpo, dots, rr, dots_rr, dapo, greso over 6 seeds, interleaved -> results/bench (BENCH_ARGS: dots bench's arguments, -S overrides)
#   make serve  serve the Prefect deployments locally (cron + event-triggered)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# Prefect's ephemeral server can take over 20 s to start the first time on two cores.
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 180
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export DO_NOT_TRACK := 1

.PHONY: install run test bench serve ui clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# pip 23 can hang for minutes resolving this dependency set; pip >= 26 does it in about two.
	$(BIN)/python -m pip install -q --upgrade "pip>=26"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

install: $(BIN)/.installed

run: install
	$(BIN)/python -m flows.pipeline

bench: install
	$(BIN)/python -m flows.bench $(BENCH_ARGS)

serve: install
	$(BIN)/python -m flows.serve

ui: install
	$(BIN)/mlflow ui --backend-store-uri sqlite:///artifacts/mlflow.db --host 127.0.0.1 --port 5000

test: install
	$(BIN)/python -m pytest -q tests

clean:
	rm -rf artifacts results
