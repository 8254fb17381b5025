"""A real Spark standalone cluster on 127.0.0.1: a master and one worker as child processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyspark

ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).resolve().parent


def spark_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_CONF_DIR=str(ROOT / "conf"),
        SPARK_LOG_DIR=str(tmp / "logs"),
        SPARK_WORKER_DIR=str(tmp / "work"),
        SPARK_NO_DAEMONIZE="1",
    )
    env.pop("PYSPARK_GATEWAY_PORT", None)
    return env


class StandaloneCluster:
    def __init__(self, tmp: Path, cores: int = 2, memory: str = "2g") -> None:
        self.tmp = tmp
        self.env = spark_env(tmp)
        self.cores, self.memory = cores, memory
        self.procs: list[subprocess.Popen] = []
        self.master_url = ""

    def _spark_class(self, name: str, *args: str, log: str) -> subprocess.Popen:
        out = open(self.tmp / log, "wb")
        proc = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), name, *args], env=self.env,
                                stdout=out, stderr=subprocess.STDOUT, cwd=self.tmp)
        self.procs.append(proc)
        return proc

    def _wait_for(self, log: str, pattern: str, timeout: float = 90) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = (self.tmp / log).read_text(errors="replace")
            match = re.search(pattern, text)
            if match:
                return match
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Spark daemon exited:\n{text[-3000:]}")
            time.sleep(0.5)
        raise TimeoutError(f"{pattern!r} not seen in {log}:\n{(self.tmp / log).read_text()[-3000:]}")

    def __enter__(self) -> StandaloneCluster:
        self._spark_class("org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
                          "--webui-port", "0", log="master.log")
        self.master_url = self._wait_for("master.log", r"Starting Spark master at (spark://127\.0\.0\.1:\d+)").group(1)
        self._spark_class("org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1",
                          "--webui-port", "0", "--cores", str(self.cores), "--memory", self.memory, log="worker.log")
        self._wait_for("worker.log", r"Successfully registered with master")
        return self

    def submit(self, script: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        cmd = [str(SPARK_HOME / "bin" / "spark-submit"), "--master", self.master_url,
               "--conf", "spark.executor.memory=1g", "--conf", "spark.driver.memory=1g", str(script), *args]
        return subprocess.run(cmd, env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)

    def __exit__(self, *exc: object) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
