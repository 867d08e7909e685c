# gpuplace — the two commands a newcomer runs: `make demo`, then `make test`.
# Everything is installed from PyPI and the Go module proxy; built binaries are cached by
# version in ~/.cache/gpuplace (override with GPUPLACE_CACHE).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: help install controlplane images node chart-tools demo test test-unit test-install test-minimums test-e2e test-faults test-load lint clean fuzz soak bench bench-smoke bench-profile

help:
	@echo "make demo        start a real control plane + mixed GPU cluster, place the example pods, print a table"
	@echo "make test        unit tests, import-layer check, end-to-end tests on the real control plane"
	@echo "make test-unit   fast tests only (no control plane, no images, no wheel install, no chart tools)"
	@echo "make test-install  build the wheel, pip install it in a fresh venv outside the tree, run its commands"
	@echo "make test-minimums  the unit tests against the oldest dependency versions pyproject.toml allows"
	@echo "                 (constraints/minimums.txt, in $(VENV_MIN)/)"
	@echo "make fuzz        the property-based bad-input tests with many examples (FUZZ_EXAMPLES, default 5000);"
	@echo "                 prints the slowest inputs each verb was answered for, with their time"
	@echo "make soak        hostile traffic against the real extender (SOAK_SECONDS, default 180); prints its RSS over time"
	@echo "make test-faults fault injection on the real control plane; prints time to converge per fault"
	@echo "make test-load   2,000 GPU pods x 5 bursts against 500 fake nodes; prints placements and extender RSS"
	@echo "make install     create $(VENV) and install gpuplace with test extras"
	@echo "make controlplane  build kube-apiserver, kube-scheduler, kubectl, etcd, helm (cached by version)"
	@echo "make images      build the gpuplace, kube-scheduler and pause images offline (hack/build-images.sh; root)"
	@echo "make chart-tools build ct and helm-unittest, fetch the CRDs the chart's tests apply (the tests do it too)"
	@echo "make node        the real node of the e2e tests: kubelet, kube-proxy, kube-controller-manager, CoreDNS"
	@echo "                 (cached by version) and containerd, runc, CNI plugins from Debian (needs root)"
	@echo "make bench       extender, kube-scheduler and cache benchmarks (3.5-6 min on 2 cores); see benchmarks/README.md"
	@echo "make bench-smoke the same at tiny sizes: checks that they run (numbers meaningless)"
	@echo "make bench-profile  pyinstrument profile of filter/prioritize at 5,000 nodes"

# gpuplace-testing (testing/: the NVML and AMD SMI stand-ins the tests and --probe fake-nvml use)
# is not on PyPI, so not in the test extra: it is installed from the tree, editable, beside gpuplace.
$(BIN)/.installed: pyproject.toml testing/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]' -e ./testing
	touch $@

install: $(BIN)/.installed

controlplane:
	hack/build-control-plane.sh all

images:
	hack/build-images.sh all

chart-tools:
	hack/install-chart-tools.sh all

node:
	hack/install-node-packages.sh
	hack/build-control-plane.sh node

lint: install
	$(BIN)/lint-imports

demo: install controlplane
	$(BIN)/python -m examples.demo $(ARGS)

test-unit: install
	$(BIN)/pytest -q -m "not e2e and not images and not install and not chart"

# Also part of `make test`.
test-install: install
	$(BIN)/pytest -q -m install

# Every direct dependency (runtime and the test extra) at its declared floor, Python wheels only, in
# a venv of its own: the floors in pyproject.toml are the ones this passes with (docs/install.md#dependencies).
VENV_MIN ?= .venv-minimums
test-minimums:
	rm -rf $(VENV_MIN)
	$(PYTHON) -m venv $(VENV_MIN)
	$(VENV_MIN)/bin/pip install -q --upgrade pip
	$(VENV_MIN)/bin/pip install -q --only-binary=:all: -c constraints/minimums.txt -e '.[test]' -e ./testing
	$(VENV_MIN)/bin/pip check
	$(VENV_MIN)/bin/lint-imports
	PATH="$$(hack/install-promtool.sh):$$PATH" $(VENV_MIN)/bin/pytest -q -p no:cacheprovider -m "not e2e and not images and not install"

FUZZ_EXAMPLES ?= 5000
fuzz: install
	GPUPLACE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/pytest -q tests/unit/test_fuzz.py

SOAK_SECONDS ?= 180
soak: install
	$(BIN)/python -m benchmarks.soak_extender --seconds $(SOAK_SECONDS) $(ARGS)

test-e2e: install controlplane node
	$(BIN)/pytest -q -m e2e

# Also part of `make test` (at a smaller size for the load test).
test-faults: install controlplane
	$(BIN)/pytest -q -m faults

test-load: install controlplane
	GPUPLACE_LOAD_NODES=$${GPUPLACE_LOAD_NODES:-500} GPUPLACE_LOAD_PODS=$${GPUPLACE_LOAD_PODS:-2000} \
	GPUPLACE_LOAD_BURSTS=$${GPUPLACE_LOAD_BURSTS:-5} $(BIN)/pytest -q -m load

test: install controlplane node lint
	PATH="$$(hack/install-promtool.sh):$$PATH" $(BIN)/pytest -q

$(BIN)/.bench-installed: $(BIN)/.installed pyproject.toml
	$(BIN)/pip install -q -e '.[test,bench]'
	touch $@

bench: $(BIN)/.bench-installed controlplane
	$(BIN)/python -m benchmarks $(ARGS)

bench-smoke: $(BIN)/.bench-installed controlplane
	$(BIN)/python -m benchmarks --smoke $(ARGS)

bench-profile: $(BIN)/.bench-installed
	$(BIN)/python -m benchmarks.profile_extender $(ARGS)

clean:
	rm -rf $(VENV) $(VENV_MIN) .pytest_cache .demo
