# handover: two entry points on a fresh Debian 12 machine (as root; both set themselves up).
#   make accept   run the acceptance suites on this machine (inventory/local.yaml), signed report
#   make test     lint (ruff, mypy), then the harness's own tests (real sshd nodes in network namespaces)

PYTHON  ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.installed-$(shell sha256sum pyproject.toml | cut -c1-12)
# Debian packages the suites use now or soon.
DEBS    := openssh-server openssh-client iproute2 nftables procps sudo tcsh stress-ng fio iperf3 hpcc openmpi-bin perftest ibverbs-utils rdma-core infiniband-diags munge slurmctld slurmd slurm-client chromium libpmix-dev
INVENTORY ?= inventory/local.yaml
PYTEST_ARGS ?=
# The harness's own tests, three at a time: most wait on namespace nodes, SSH and sleeps, not on
# CPU (three kept 2 cores about 80 % busy). Modules that must not share the machine run in
# one group (tests/conftest.py).
TEST_WORKERS ?= 3
# make accept runs the quick depth; a real delivery runs the full one too (-m full).
ACCEPT_ARGS ?= -m quick
# The scratch path inventory/local.yaml declares: storage (fio) and HPL (hpcc) write only there.
SCRATCH := /var/tmp/handover-scratch

# The device proof kit (README, "Device proof kit"): the project and its dependencies' wheels for
# a GPU machine without a package registry, whose Python is KIT_PYTHON (glibc KIT_GLIBC or newer).
KIT_PYTHON ?= 3.12
KIT_GLIBC ?= 2.28
KIT     := out/device-proof.tar.gz

.PHONY: accept test setup debs bench clean device-proof

# The venv first on PATH: node-side payloads run with `python3`, which then has torch and pynvml
# (the test extra), so the training, collectives and GEMM checks run here instead of skipping.
accept: setup
	mkdir -p $(SCRATCH)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m pytest --inventory $(INVENTORY) $(ACCEPT_ARGS) $(PYTEST_ARGS)

# The gate: lint and types first (seconds), then the harness's own tests; -rs says why any skipped.
test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest tests --strict-markers -rs -n $(TEST_WORKERS) $(PYTEST_ARGS)

bench: setup
	$(PY) bench/fanout.py
	$(PY) bench/pairs.py
	$(PY) bench/collect.py
	$(PY) bench/scale_paths.py
	$(PY) bench/system_suite.py

device-proof: setup
	$(PY) kit/build.py --python-version $(KIT_PYTHON) --glibc $(KIT_GLIBC) --out $(KIT)

setup: debs $(STAMP)

debs:
	@missing=$$(for p in $(DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" != 0 ]; then echo "handover: as root, install: apt-get install -y $$missing" >&2; exit 1; fi; \
		echo "handover: installing $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	rm -f $(VENV)/.installed-*
	touch $@

clean:
	rm -rf $(VENV) out *.egg-info
