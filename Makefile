# Every target bootstraps .venv on first use, so each works on a fresh clone. The editable install
# uses a .pth path entry (compat mode) so Spark's discovery of pyspark_* modules finds pyspark_orderlymq.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: demo cluster test faults fuse browser zookeeper faketime jdk bench proto constraints lint clean

# The power-loss scenarios (tests/faults/test_power_loss.py) mount a FUSE file system: Debian's fuse3
# (fusermount3) and libfuse3, installed once when missing.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

$(STAMP): setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]' --config-settings editable_mode=compat
	touch $(STAMP)

# Hadoop's local file system without a forked chmod per file (connector/spark/local_fs.py), compiled
# against the Hadoop API jar of the pyspark in .venv. Jobs, tests and benchmarks put it on Spark's class path.
HADOOP_FS_JAR := connector/spark/jars/orderlymq-hadoop.jar
HADOOP_FS_SRC := $(wildcard connector/spark/jvm/org/orderlymq/hadoop/*.java)
HADOOP_API_JAR = $(shell $(PY) -c 'import glob, os, pyspark; print(*glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar")))')

$(HADOOP_FS_JAR): $(HADOOP_FS_SRC) $(STAMP) | jdk
	rm -rf $(@D)/classes && mkdir -p $(@D)/classes
	javac --release 17 -cp $(HADOOP_API_JAR) -d $(@D)/classes $(HADOOP_FS_SRC)
	jar cf $@ -C $(@D)/classes .
	rm -rf $(@D)/classes

# javac and jar for the jar above: Debian's JDK 17 (Spark itself needs only the runtime), installed once when missing.
jdk:  ## Debian's JDK 17 to compile the Hadoop file system class (nothing to do when present)
	@if ! command -v javac >/dev/null 2>&1 || ! command -v jar >/dev/null 2>&1; then \
		echo "installing Debian's openjdk-17-jdk-headless (javac, to build $(HADOOP_FS_JAR))"; \
		$(SUDO) apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq openjdk-17-jdk-headless >/dev/null; \
	fi

demo: $(STAMP) $(HADOOP_FS_JAR)  ## start the embedded broker and run the demo pipeline
	$(PY) spark_jobs/demo.py $(ARGS)

cluster: $(STAMP) zookeeper  ## a local cluster: ZooKeeper + 3 broker groups x 2 brokers on loopback (Ctrl-C stops it)
	$(PY) -m broker.cluster.local_cluster up $(ARGS)

fuse:  ## Debian's fuse3 and libfuse3 for the power-loss tests (nothing to do when present)
	@if ! command -v fusermount3 >/dev/null 2>&1 || ! /sbin/ldconfig -p | grep -q 'libfuse3\.so\.3 '; then \
		echo "installing Debian's fuse3 and libfuse3-3 (FUSE for the power-loss tests)"; \
		$(SUDO) apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq fuse3 libfuse3-3 >/dev/null; \
	fi

# The console tests (tests/console) drive Debian's headless chromium through chromium-driver.
browser:  ## Debian's chromium and chromium-driver for the console tests (nothing to do when present)
	@if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then \
		echo "installing Debian's chromium and chromium-driver (headless browser for the console tests)"; \
		$(SUDO) apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium chromium-driver >/dev/null; \
	fi

# The broker-group tests (tests/cluster) run Debian's ZooKeeper (Java 17 is present), installed once when missing.
zookeeper:  ## Debian's ZooKeeper for the cluster tests (nothing to do when present)
	@if [ ! -f /usr/share/java/zookeeper.jar ]; then \
		echo "installing Debian's zookeeper (the control plane of broker groups, for the cluster tests)"; \
		$(SUDO) apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq zookeeper >/dev/null; \
	fi

# The clock-step tests (tests/broker/test_clock_steps.py) run a broker under Debian's libfaketime.
faketime:  ## Debian's libfaketime for the clock-step tests (nothing to do when present)
	@if ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then \
		echo "installing Debian's libfaketime (steps a broker's wall clock in the clock-step tests)"; \
		$(SUDO) apt-get update -qq >/dev/null && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq libfaketime >/dev/null; \
	fi

# Two pytest workers (pytest-xdist): most tests wait on brokers, leases, failovers and Spark, so two
# overlap on two cores (27 -> 18 min); the long tests (@pytest.mark.slow) are handed out first.
# TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2

test: $(STAMP) $(HADOOP_FS_JAR) fuse browser zookeeper faketime  ## the whole test suite (what CI runs)
	$(PY) -m pytest -n $(TEST_WORKERS) $(ARGS)

faults: $(STAMP) $(HADOOP_FS_JAR) fuse zookeeper faketime  ## the long versions of the fault scenarios
	ORDERLYMQ_FAULTS=long $(PY) -m pytest tests/faults $(ARGS)

bench: $(STAMP) $(HADOOP_FS_JAR)  ## benchmarks (Redis Streams and NATS JetStream as peers): a table and bench-results.json
	$(PY) spark_jobs/bench.py $(ARGS)

proto: $(STAMP)  ## regenerate the gRPC stubs from broker/proto/orderlymq.proto
	$(PY) -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. --pyi_out=. broker/proto/orderlymq.proto

constraints: $(STAMP)  ## re-pin constraints.txt to what .venv has now
	(head -2 constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -vi '^orderlymq') > constraints.txt.new
	mv constraints.txt.new constraints.txt

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) data bench-results.json $(HADOOP_FS_JAR)
