# Two entry points for a newcomer: `make demo` runs the daemon on a local broker with synthetic traffic,
# `make test` installs everything the tests need and runs the whole suite. Both set themselves up.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo demo-stack image test test-deps lint bench lock clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# uv, pinned, in a venv of its own: it compiles the lock files (`make lock`) and installs them (below), several
# downloads at a time and without byte-compiling every module (a fresh clone's .venv: 1 min, pip's 3).
UV_VENV := .venv-uv
UV      := $(UV_VENV)/bin/uv
$(UV):
	$(PYTHON) -m venv $(UV_VENV)
	$(UV_VENV)/bin/pip install --quiet uv==0.13.9

# The test and developer environment comes from lock files with hashes (requirements/*.lock, kept by uv through
# `make lock`): uv installs exactly those files, resolving nothing, then the package itself in editable mode with the
# locked build backend. CI, a developer's venv and the images (deploy/requirements.lock) get the same versions.
LOCKS := requirements/test.lock requirements/nodeps.lock
UV_INSTALL = $(UV) pip install --quiet --python $(1)/bin/python --no-deps
$(STAMP): pyproject.toml $(LOCKS) | $(BIN)/python $(UV)
	$(call UV_INSTALL,$(VENV)) --require-hashes $(addprefix -r ,$(LOCKS))
	$(call UV_INSTALL,$(VENV)) --no-build-isolation -e .
	$(BIN)/python tools/install_helm.py --dest $(BIN)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fairness-exporter demo

# Debian packages the tests run for real: prometheus (server + promtool) and prometheus-alertmanager (+ amtool) for
# the rule and end-to-end tests, buildah + mmdebstrap to build and run the image, chromium for the HTML reports' and the demo's screenshots.
APT_TOOLS    := promtool prometheus amtool buildah mmdebstrap chromium
APT_PACKAGES := prometheus prometheus-alertmanager buildah mmdebstrap chromium
define apt_install
	@for tool in $(1); do command -v $$tool >/dev/null || missing=1; done; [ -z "$$missing" ] || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(2); }
endef

# checkov, the chart scanner of a platform review (tests/test_helm_hardening.py), in a venv of its own: its many pins
# are not the project's. About 20 s and 290 MB.
CHECKOV_VENV := .venv-checkov
$(CHECKOV_VENV)/bin/checkov:
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install --quiet checkov==3.3.30

# MLServer and the KServe SDK, whose own codecs, protobuf classes and CloudEvents make the payload tests' records
# (tests/platform_payloads.py, run as a subprocess), in a venv of their own: they pin protobuf and pandas below the
# project's, and each registers the inference.* protobuf messages. About 60 s and 700 MB.
PLATFORMS_VENV := .venv-platforms
# Its lock (hashes, as requirements/test.lock) is compiled by `make lock`.
$(PLATFORMS_VENV)/.installed: requirements/platforms.lock | $(UV)
	$(PYTHON) -m venv $(PLATFORMS_VENV)
	$(call UV_INSTALL,$(PLATFORMS_VENV)) --require-hashes -r requirements/platforms.lock
	touch $@

# Grafana's published dashboard schema (@grafana/schema) and tsc, pinned by tools/grafana-schema/package-lock.json,
# for tests/test_dashboard.py; needs node and npm (Debian's nodejs and npm where missing)
GRAFANA_SCHEMA := tools/grafana-schema
$(GRAFANA_SCHEMA)/node_modules/.package-lock.json: $(GRAFANA_SCHEMA)/package-lock.json
	$(call apt_install,node npm,nodejs npm)
	npm ci --prefix $(GRAFANA_SCHEMA) --no-audit --no-fund --silent

test-deps: $(STAMP) $(CHECKOV_VENV)/bin/checkov $(PLATFORMS_VENV)/.installed \
           $(GRAFANA_SCHEMA)/node_modules/.package-lock.json
	$(call apt_install,$(APT_TOOLS),$(APT_PACKAGES))

# the demo with Prometheus, Alertmanager and a webhook sink: needs only the monitoring stack
demo-stack: $(STAMP)
	$(call apt_install,prometheus amtool,prometheus prometheus-alertmanager)
	$(BIN)/fairness-exporter demo --stack

# both images (the daemon, and the full one with the gate) with docker where its engine answers, else buildah on a
# Python 3.11 base made from Debian packages (tools/image.py).
image:
	$(PYTHON) tools/image.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy exporter

# The environments install side by side (downloads and disk, not CPU), and lint runs once .venv is there: one
# parallel make, whatever -j `make test` was given. Then the docs site (a broken link or anchor fails it), then the
# suite, which runs the docs' examples too: 4 workers whatever the cores, as most tests wait on a broker, a server or
# a subprocess (docs/development.md); each file on one worker, the longest files first (tests/conftest.py).
test:
	$(MAKE) --jobs=4 --output-sync=target test-deps lint
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
	$(BIN)/pytest -n 4 --dist loadfile

# curl times the scrapes of bench/scrape.py (a C client, as Prometheus is no Python one)
bench: $(STAMP)
	$(call apt_install,curl,curl)
	$(BIN)/python -m bench

# Refresh the lock files after a change of pyproject.toml's dependencies (or to take new releases: delete a pin's
# lines first). uv keeps the pins already in a file unless the project's ranges exclude them; the images' constraints
# (deploy/requirements.lock) are compiled against the test lock, so both hold the same versions.
UV_COMPILE := $(UV) pip compile --quiet --python-version 3.11 --custom-compile-command "make lock"

lock: | $(UV)
	$(UV_COMPILE) pyproject.toml requirements/build.in --extra test --universal --generate-hashes -o requirements/test.lock
	$(UV_COMPILE) requirements/nodeps.in --no-deps --universal --generate-hashes -o requirements/nodeps.lock
	$(UV_COMPILE) requirements/platforms.in --universal --generate-hashes -o requirements/platforms.lock
	$(UV_COMPILE) pyproject.toml requirements/build.in $(addprefix --extra ,gate reports storage seldon seldon-arrow bisg) \
	  -c requirements/test.lock --python-platform linux --no-annotate -o deploy/requirements.lock

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) $(UV_VENV) $(PLATFORMS_VENV) $(GRAFANA_SCHEMA)/node_modules .pytest_cache .ruff_cache .hypothesis site
