# The two commands of the README: `make demo` (the main job) and `make test` (the suite).
# Both create .venv on first use and install the project into it.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test docs lint sysdeps venv clean bench bench-train bench-allreduce bench-hosts \
	bench-sysdeps bench-deferral

$(STAMP): pyproject.toml setup.cfg
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,plot,docs]'
	@# setuptools leaves the build's egg-info in provider/, which the editable install puts on
	@# sys.path: a second copy of the distribution's metadata, so Airflow would load the
	@# `airflow.plugins` entry point twice ("Plugin 'ringflow' already registered")
	rm -rf provider/*.egg-info
	touch $(STAMP)

venv: $(STAMP)

# System packages the tests need, each installed only when missing: the OpenSSH server (the
# SSH tests start their own sshd), Debian's python3-numpy (the namespace test hosts run the
# runtime on /usr/bin/python3, not on .venv, so the numpy floor is tested for real), Open
# MPI's mpirun (openmpi-bin: ringflow-poprun runs PopRun instances with it), tcpdump and
# strace (the secrets tests watch the hosts' links and every command line) and Debian's
# Chromium (the e2e tests drive /usr/bin/chromium with Playwright; no browser download).
sysdeps:
	@debs=""; browser=""; \
	if [ ! -x /usr/sbin/sshd ] || ! command -v ssh-keygen >/dev/null; then \
		debs="openssh-server openssh-client"; \
	fi; \
	if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then debs="$$debs python3-numpy"; fi; \
	if ! command -v mpirun >/dev/null; then debs="$$debs openmpi-bin"; fi; \
	if ! command -v tcpdump >/dev/null; then debs="$$debs tcpdump"; fi; \
	if ! command -v strace >/dev/null; then debs="$$debs strace"; fi; \
	if [ ! -x /usr/bin/chromium ]; then browser="chromium"; fi; \
	if [ -n "$$debs$$browser" ]; then \
		echo "installing $$debs $$browser"; \
		apt-get update -qq || exit 1; \
	fi; \
	if [ -n "$$debs" ]; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$debs >/dev/null || exit 1; \
	fi; \
	if [ -n "$$browser" ]; then \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
			$$browser >/dev/null || exit 1; \
	fi

# The demo's Airflow home lives in the checkout (ignored by git): SQLite, the embedded default,
# migrated on the first run only; the DAGs are this checkout's dags/. ringflow's folders (the
# runs' worker logs and plots, the checkpoints, the jobs' state) go into it too, as
# $(DEMO_HOME)/ringflow, not ~/.ringflow (shared by every checkout): `make clean` removes
# them with it. DEMO_CONF is the run's conf, e.g. make demo DEMO_CONF='{"steps": 50}'.
DEMO_HOME := $(CURDIR)/.airflow
DEMO_ENV  := AIRFLOW_HOME=$(DEMO_HOME) AIRFLOW__CORE__DAGS_FOLDER=$(CURDIR)/dags \
	AIRFLOW__CORE__LOAD_EXAMPLES=False RINGFLOW_HOME=$(DEMO_HOME)/ringflow
DEMO_CONF ?=

demo: $(STAMP)
	@mkdir -p $(DEMO_HOME)
	@if [ ! -f $(DEMO_HOME)/airflow.db ]; then \
		echo "migrating the demo's Airflow database in $(DEMO_HOME) (first run only)"; \
		$(DEMO_ENV) $(VENV)/bin/airflow db migrate >$(DEMO_HOME)/migrate.log 2>&1 \
			|| { tail -30 $(DEMO_HOME)/migrate.log; rm -f $(DEMO_HOME)/airflow.db; exit 1; }; \
	fi
	$(DEMO_ENV) $(VENV)/bin/airflow dags test ringflow_tp_train $(if $(DEMO_CONF),-c '$(DEMO_CONF)')
	@# the DAG scheduled on the model's Asset (no scheduler here: run by hand, it takes the
	@# Asset's newest event); a model that misses the gate fails it, and the summary says so
	-$(DEMO_ENV) $(VENV)/bin/airflow dags test ringflow_tp_train_evaluate
	@$(DEMO_ENV) $(PY) scripts/demo_summary.py ringflow_tp_train train \
		ringflow_tp_train_evaluate evaluate

lint: $(STAMP)
	$(VENV)/bin/ruff check provider tests benchmarks dags scripts examples

# The docs site (mkdocs.yml, docs/) into build/site; --strict: a broken link, a page missing
# from the nav or an argument without docs is an error. Also built by tests/test_docs.py.
# The argument tables import the operators, so Airflow: its home is a folder in build/, not
# the user's ~/airflow.
docs: $(STAMP)
	AIRFLOW_HOME=$(CURDIR)/build/docs-airflow NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The suite in TEST_WORKERS processes (pytest-xdist; each its own Airflow home, namespace
# hosts and sshd): it mostly waits (Airflow's CLI and scheduler, heartbeat timeouts), so two
# on two cores take about two thirds of the time of one. The tests that use the Airflow
# services stay in one worker (their xdist group).
TEST_WORKERS ?= 2

test: sysdeps $(STAMP)
	$(VENV)/bin/ruff check provider tests benchmarks dags scripts examples
	$(MAKE) docs
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

# Benchmarks (not tests). The training step compares against PyTorch, which is installed
# only into benchmarks/.venv-torch (made by the script on first use), never into .venv.
bench: bench-train bench-allreduce bench-hosts bench-deferral

bench-train: $(STAMP)
	$(PY) benchmarks/train_step.py

# Open MPI is an all-reduce anchor (through mpi4py in the benchmark venv).
bench-sysdeps:
	@if ! command -v mpirun >/dev/null || ! command -v mpicc >/dev/null; then \
		echo "installing openmpi-bin and libopenmpi-dev"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			openmpi-bin libopenmpi-dev >/dev/null; \
	fi

bench-allreduce: bench-sysdeps $(STAMP)
	$(PY) benchmarks/allreduce.py

# All-reduce between two namespace hosts (root; python3-numpy from sysdeps).
bench-hosts: sysdeps $(STAMP)
	$(PY) benchmarks/allreduce_hosts.py

# Deferral through real Airflow services: worker-slot seconds, one triggerer and 50 jobs
# (root: namespace hosts).
bench-deferral: sysdeps $(STAMP)
	$(PY) benchmarks/deferral.py --readme

clean:
	rm -rf $(VENV) build *.egg-info provider/*.egg-info .pytest_cache .airflow
