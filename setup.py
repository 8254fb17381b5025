from setuptools import find_packages, setup

setup(
    name="orderlymq",
    version="0.1.0",
    description="An ordered message broker in the mould of RocketMQ's ordered messages, "
    "with a PySpark Structured Streaming source and sink",
    python_requires=">=3.10",
    packages=find_packages(include=["broker", "broker.*", "connector", "connector.*", "pyspark_orderlymq", "spark_jobs", "bench"]),
    package_data={"broker.proto": ["*.proto", "*.pyi"]},
    install_requires=[
        "grpcio==1.85.1",
        "protobuf==7.36.2",
        "pyarrow==26.0.1",
        "numpy==2.4.6",
        "xxhash==4.1.0",
        "crc32c==2.9.post0",
        "pyspark==4.3.0",
        "py4j==0.10.9.9",
        "pandas==2.3.3",
        "rich==15.0.0",
    ],
    extras_require={
        "test": [
            "pytest==9.2.0",
            "pytest-timeout==2.4.0",
            "hypothesis==6.170.15",
            "grpcio-tools==1.85.1",
            "nbclient==0.11.0",
            "nbformat==5.11.1",
            "ipykernel==7.4.0",
            "matplotlib==3.11.2",
            "ruff==0.17.5",
        ],
    },
    entry_points={
        "console_scripts": [
            "orderlymq-broker=broker.__main__:main",
            "orderlymq=connector.cli:main",
        ],
    },
)
