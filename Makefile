# l9gpu: two commands set everything up on a fresh machine.
#   make demo   run the agent on the built-in simulated node (8 x H100, pods, a zombie)
#   make demo-training   a training job that wedges: the page names its stalled GPUs
#   make demo-training-fleet   the same job on several nodes, and Prometheus naming its odd rank
#   make demo-report   a week of that node's chargeback as HTML, CSV and JSON (docs/CHARGEBACK.md)
#   make test   install what the tests need (Debian's prometheus included) and run them
#   make test-stress   the same suite while CPU hogs keep the machine busy
#   make image-test    build the Dockerfile with buildah and run the agent in the image
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The demos listen on loopback only; LISTEN=0.0.0.0:9835 (or an address) serves them to others.
LISTEN ?= 127.0.0.1:9835
PORT := $(lastword $(subst :, ,$(LISTEN)))

.PHONY: demo demo-incidents demo-training demo-training-fleet demo-report image-lock image-test test test-stress venv deps-test system-deps lint bench gpu-wheels docs chart dist clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

venv: $(PY)
	$(PY) -m pip install --quiet -e '.[all]'

demo: venv
	@echo "l9gpu demo: simulated node, page at http://localhost:$(PORT)/ and metrics at /metrics (Ctrl-C to stop)"
	$(VENV)/bin/l9gpu serve --backend simulated --listen $(LISTEN) --pod-label team

# The incidents of docs/INCIDENTS.md played on a small simulated node in its first two
# minutes: an Xid a pod caused, a GPU filled until a notebook died, a GPU off the bus.
demo-incidents: venv
	@echo "l9gpu demo: incidents within 2 minutes on the page's Incidents panel, http://localhost:$(PORT)/ and /api/v1/incidents (Ctrl-C to stop)"
	$(VENV)/bin/l9gpu serve --backend simulated --scenario incidents --kernel-log auto --listen $(LISTEN) --pod-label team

# A training job that wedges (docs/TRAINING.md): its ranks compute, checkpoint, evaluate, and
# at 2m all but rank 5 wedge in a collective; with --stall-after 1m the page's banner names the
# stalled GPUs, their pods, job and ranks at 3m. STALL_AFTER=30s shortens the wait; the
# L9GPU_TRAINING_* variables play another node of the job (docs/TRAINING.md).
STALL_AFTER ?= 1m
demo-training: venv
	@echo "l9gpu demo: a training job wedges at 2m; the page names its stalled GPUs $(STALL_AFTER) later, http://localhost:$(PORT)/ (Ctrl-C to stop)"
	$(VENV)/bin/l9gpu serve --backend simulated --scenario training --stall-after $(STALL_AFTER) --listen $(LISTEN)

# One training job across simulated nodes (docs/TRAINING.md, "Across nodes"): an agent per node
# (the training scenario, 8 ranks each) and Debian's Prometheus (make system-deps) with
# alerts/l9gpu-training.rules.yaml. A GPU of the last node is a hardware straggler from the
# first minute; the job wedges after 3m and L9gpuTrainingJobHung names rank worker-5 about two
# minutes later.
# Prometheus listens on LISTEN's port, the agents on the ports after it.
demo-training-fleet: venv
	$(PY) deploy/demo/training_fleet.py --listen $(LISTEN)

# The chargeback of docs/CHARGEBACK.md on a week of the demo node: the agent's passes played
# on a simulated clock, backfilled with promtool into Debian's Prometheus (installed here when
# missing), the recording rules evaluated, `l9gpu report` written as HTML, CSV and JSON into
# DEMO_REPORT_DIR. A few minutes on 2 cores.
DEMO_REPORT_DIR ?= demo-report
demo-report: venv
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || $(MAKE) system-deps
	$(PY) -m exporter.report.demo --output $(DEMO_REPORT_DIR)

# promtool and prometheus for the end-to-end tests, chromium (headless) for the page's
# browser tests and the HTML chargeback report, containerd, runc and busybox-static for the
# tests against a real container runtime (Debian packages, need root). Those tests start
# their own containerd: a policy-rc.d keeps the package from starting the node-wide
# containerd.service while it installs (a system containerd on /run/containerd would be
# found by the agent's --cri-socket auto in other tests).
SYSTEM_TOOLS := promtool prometheus chromium containerd ctr containerd-shim-runc-v2 runc busybox kubectl pkg-config \
	/lib/systemd/systemd-journal-remote victoria-metrics vmalert
system-deps:
	@missing=; for tool in $(SYSTEM_TOOLS); do command -v $$tool >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		guard=; if [ ! -e /usr/sbin/policy-rc.d ]; then \
			printf '#!/bin/sh\nexit 101\n' | $$SUDO tee /usr/sbin/policy-rc.d >/dev/null && $$SUDO chmod +x /usr/sbin/policy-rc.d && guard=1; \
		fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
			prometheus chromium containerd runc busybox-static systemd-journal-remote libsystemd-dev pkg-config \
			victoria-metrics $$(command -v kubectl >/dev/null || echo kubernetes-client) >/dev/null; status=$$?; \
		if [ -n "$$guard" ]; then $$SUDO rm -f /usr/sbin/policy-rc.d; fi; \
		exit $$status; \
	fi

deps-test: $(PY)
	$(PY) -m pip install --quiet -e '.[test,all,journal]'

test: system-deps deps-test
	$(PY) -m pytest -q -p no:cacheprovider tests

# The whole suite on a busy machine: STRESS_CPUS CPU hogs (Debian stress-ng, installed
# here when missing; needs root or sudo) run beside pytest, as other jobs do on a shared
# CI runner. Fails when pytest fails (printing its status); the hogs are stopped however
# pytest ends, also when the target is interrupted or terminated (pytest runs in the
# background so that the shell can act on the signal at once), and their own --timeout
# stops them should the shell itself be killed.
STRESS_CPUS ?= 2
test-stress: system-deps deps-test
	@if ! command -v stress-ng >/dev/null; then \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq stress-ng >/dev/null; \
	fi
	@stress-ng --cpu $(STRESS_CPUS) --timeout 3h --quiet & hogs=$$!; \
	trap 'kill $$hogs 2>/dev/null; wait $$hogs 2>/dev/null' EXIT; \
	trap 'kill $$tests 2>/dev/null; wait $$tests 2>/dev/null; exit 130' INT TERM; \
	echo "test-stress: $(STRESS_CPUS) CPU hog(s) running (stress-ng pid $$hogs)"; \
	$(PY) -m pytest -q -p no:cacheprovider tests $(PYTEST_ARGS) & tests=$$!; \
	wait $$tests; status=$$?; \
	echo "test-stress: pytest exited with $$status; stopping the hogs"; exit $$status

lint: deps-test
	$(PY) -m ruff check exporter bridge tests benchmarks
	$(PY) -m mypy exporter bridge

bench: venv
	$(PY) benchmarks/bench_agent.py

# What benchmarks/gpu_run.sh installs on a GPU machine without network access: the peer
# gpu_check.py compares the agent with (nvitop-exporter), as wheels for Python 3.12.
gpu-wheels:
	$(PYTHON) -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_17_x86_64 -d .whl nvitop-exporter==1.7.2 nvitop==1.7.2

docs: venv
	$(PY) -m exporter.output.metrics_doc > docs/METRICS.md
	$(PY) -m exporter inference-rules -o alerts/l9gpu-inference.rules.yaml
	$(PY) -m exporter.report.rules > alerts/l9gpu-chargeback.rules.yaml
	cp alerts/l9gpu.rules.yaml alerts/l9gpu-inference.rules.yaml alerts/l9gpu-chargeback.rules.yaml \
		alerts/l9gpu-training.rules.yaml charts/l9gpu/files/

# The Helm chart as a static Helm repository: dist/charts/l9gpu-<version>.tgz and index.yaml
# (Helm's own engine, from helm-python-sdk). CHART_URL=https://... makes the index's
# archive URLs absolute; without it they are relative to wherever the folder is served.
chart: deps-test
	$(PY) charts/package.py dist/charts $(if $(CHART_URL),--url $(CHART_URL))

# The agent as a wheel built from this checkout, dist/l9gpu_agent-<version>-py3-none-any.whl,
# for machines that install it with pip (the package index's "l9gpu" is another project).
dist: $(PY)
	rm -rf build  # setuptools would pack files left there by an older build
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist .
	@ls dist/l9gpu_agent-*.whl

# The image's dependencies, pinned with their hashes for the Dockerfile: requirements/image.txt
# (the [all,journal] extras of setup.cfg) and requirements/image-build.txt (what builds the
# wheels), resolved from PyPI for the image's Python 3.11 on x86_64 by uv. Run after changing
# setup.cfg's requirements, or to take newer releases; commit both files.
image-lock: $(PY)
	$(PY) -m pip install --quiet 'uv>=0.9,<1'
	UV_NO_CONFIG=1 $(VENV)/bin/uv pip compile setup.cfg --extra all --extra journal $(UV_LOCK_FLAGS) -o requirements/image.txt
	UV_NO_CONFIG=1 $(VENV)/bin/uv pip compile requirements/image-build.in $(UV_LOCK_FLAGS) -o requirements/image-build.txt
UV_LOCK_FLAGS := --quiet --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	--index-url https://pypi.org/simple --custom-compile-command "make image-lock"

# tests/test_image.py: the Dockerfile built with Debian's buildah on a bootstrapped Debian
# standing in for the base image (no registry needed), then l9gpu --version, the simulated
# node and a journal read run in it, and its pip freeze compared with the lock. Needs root;
# installs buildah and debootstrap. The bootstrapped base is kept in L9GPU_IMAGE_CACHE
# (default /var/tmp/l9gpu-image-test); the image is built whole each run: a few minutes.
image-test: deps-test
	@command -v buildah >/dev/null && command -v debootstrap >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq buildah debootstrap >/dev/null; }
	L9GPU_IMAGE_TEST=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_image.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
