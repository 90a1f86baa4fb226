# l9gpu: two commands set everything up on a fresh machine.
#   make demo   run the agent on the built-in simulated node (8 x H100, pods, a zombie)
#   make test   install what the tests need (Debian's prometheus included) and run them
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
LISTEN ?= 0.0.0.0:9835
PORT := $(lastword $(subst :, ,$(LISTEN)))

.PHONY: demo test venv deps-test system-deps lint bench docs chart clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

venv: $(PY)
	$(PY) -m pip install --quiet -e '.[all]'

demo: venv
	@echo "l9gpu demo: simulated node, page at http://localhost:$(PORT)/ and metrics at /metrics (Ctrl-C to stop)"
	$(VENV)/bin/l9gpu serve --backend simulated --listen $(LISTEN) --pod-label team

# promtool and prometheus for the end-to-end tests, chromium (headless) for the page's
# browser tests and the HTML chargeback report (Debian packages, need root).
system-deps:
	@if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null || ! command -v chromium >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq prometheus chromium >/dev/null; \
	fi

deps-test: $(PY)
	$(PY) -m pip install --quiet -e '.[test,all]'

test: system-deps deps-test
	$(PY) -m pytest -q -p no:cacheprovider tests

lint: deps-test
	$(PY) -m ruff check exporter bridge tests benchmarks
	$(PY) -m mypy exporter bridge

bench: venv
	$(PY) benchmarks/bench_agent.py

docs:
	$(PYTHON) -m exporter.catalogue > docs/METRICS.md

# The Helm chart as a static Helm repository: dist/charts/l9gpu-<version>.tgz and index.yaml
# (Helm's own engine, from helm-python-sdk). CHART_URL=https://... makes the index's
# archive URLs absolute; without it they are relative to wherever the folder is served.
chart: deps-test
	$(PY) charts/package.py dist/charts $(if $(CHART_URL),--url $(CHART_URL))

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
