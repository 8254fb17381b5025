"""A Spark read -> write pipeline against a broker with TLS and access control: the source and the
sink connect with the options' CA and credentials; a wrong secret fails with a clear message
that never shows it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.security.acl import Rule
from connector.client.connection import BrokerConnection, Credentials, TlsOptions
from connector.spark.transactions import SINK_LOG_TOPIC
from tests.security.conftest import AclFile
from tests.security.pki import CertificateAuthority
from tests.spark.helpers import (
    assert_delivered,
    create_topic,
    keyed_events,
    produce,
    row_events,
    topic_delivered,
    topic_events,
)

PIPELINE_SECRET = "pipeline-secret-0042"
USERS = {"admin": "admin-secret-0001", "pipeline": PIPELINE_SECRET}
RULES = (
    Rule("admin", "allow", ("admin", "publish", "subscribe"), ("topic:*", "group:*", "broker")),
    Rule("pipeline", "allow", ("subscribe",), ("topic:in-*", "group:copier")),
    Rule("pipeline", "allow", ("publish",), ("topic:out-*",)),
    # The exactly-once sink's own log (docs/security.md): an administrator creates the topic.
    Rule("pipeline", "allow", ("publish", "subscribe"), ("topic:__orderlymq_spark_sink", "group:spark-sink/*")),
)


@pytest.fixture
def secure(broker_factory, tmp_path):
    ca = CertificateAuthority(tmp_path)
    server = ca.issue("broker")
    acl = AclFile(tmp_path / "acl.toml")
    acl.write(RULES, USERS)
    broker = broker_factory(tls_cert_file=server.cert_file, tls_key_file=server.key_file, acl_file=str(acl.path))
    tls = TlsOptions(ca_file=ca.ca_file)
    with BrokerConnection(broker.address, retry_timeout=5, tls=tls,
                          credentials=Credentials("admin", USERS["admin"])) as conn:
        create_topic(conn, SINK_LOG_TOPIC, 1)
        yield broker, ca, conn


def _security_options(ca: CertificateAuthority, secret: str = PIPELINE_SECRET) -> dict[str, str]:
    return {"tls.caFile": ca.ca_file, "auth.accessKey": "pipeline", "auth.secretKey": secret}


def test_stream_copy_with_tls_and_credentials(ospark, secure, tmp_path):
    broker, ca, conn = secure
    source, target = "in-orders", "out-orders"
    create_topic(conn, source, 3)
    create_topic(conn, target, 2)
    events = keyed_events(6, 8)
    produce(conn, source, 3, events)
    options = _security_options(ca)
    reader = (ospark.readStream.format("orderlymq").option("brokers", broker.address).option("topic", source)
              .option("consumerGroup", "copier").option("maxMessagesPerTrigger", "20"))
    writer_options = {"brokers": broker.address, "topic": target, "shardingKey": "key",
                      "checkpointLocation": str(tmp_path / "ck"), **options}
    query = reader.options(**options).load().writeStream.format("orderlymq").options(**writer_options) \
        .trigger(availableNow=True).start()
    try:
        query.awaitTermination(180)
        assert query.exception() is None
        progress = " ".join(p.json for p in query.recentProgress)
    finally:
        query.stop()
    assert_delivered(events, topic_delivered(topic_events(conn, target)))
    assert PIPELINE_SECRET not in progress


def test_a_wrong_secret_fails_the_read_without_showing_it(ospark, secure):
    broker, ca, conn = secure
    create_topic(conn, "in-denied", 1)
    df = (ospark.read.format("orderlymq").option("brokers", broker.address).option("topic", "in-denied")
          .options(**_security_options(ca, secret="not-the-pipeline-secret")).load())
    with pytest.raises(Exception) as err:
        df.collect()
    assert "wrong secret key for access key 'pipeline'" in str(err.value)
    assert "not-the-pipeline-secret" not in str(err.value)


def test_credentials_from_spark_conf_alone(secure):
    """``spark.executorEnv.ORDERLYMQ_*`` reaches every Python worker, the one planning the query
    included: a batch read with no auth option, in a process with no credentials of its own."""
    broker, ca, conn = secure
    create_topic(conn, "in-conf", 2)
    events = keyed_events(4, 5)
    produce(conn, "in-conf", 2, events)
    environment = {name: value for name, value in os.environ.items() if not name.startswith("ORDERLYMQ_")}
    environment |= {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    job = Path(__file__).parent / "jobs" / "read_with_conf_credentials.py"
    result = subprocess.run([sys.executable, str(job), broker.address, "in-conf", ca.ca_file, "pipeline"],
                            input=PIPELINE_SECRET + "\n", env=environment, capture_output=True, text=True,
                            timeout=300, cwd=Path(__file__).parents[2])
    assert result.returncode == 0, result.stderr[-4000:]
    assert PIPELINE_SECRET not in result.stdout + result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert_delivered(events, row_events(rows))
