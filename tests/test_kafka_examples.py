"""pyspark 2.4's ``direct_kafka_wordcount.py`` runs against the real broker with only its imports changed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.kafka_support import create_topic, produce

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("confluent_kafka")


def test_direct_kafka_wordcount_example_counts_the_words_written_to_its_topic(kafka_bootstrap, tmp_path):
    source = (ROOT / "examples" / "direct_kafka_wordcount.py").read_text()
    assert "from dstreams.kafka import KafkaUtils" in source and "from pyspark.streaming" not in source
    topic = create_topic(kafka_bootstrap, partitions=2)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    log = (tmp_path / "out.log").open("w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "direct_kafka_wordcount.py"), kafka_bootstrap,
                             topic], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        # The stream starts at the latest offsets (pyspark 2.4's default): write until a batch has counted them.
        deadline = time.monotonic() + 180
        seen = ""
        while time.monotonic() < deadline and "('kafka', 3)" not in seen:
            assert proc.poll() is None, (tmp_path / "out.log").read_text()[-3000:]
            if "Time:" in seen:  # the stream runs: one burst of lines lands in one 2 s batch
                produce(kafka_bootstrap, topic, [(None, "hello kafka"), (None, "kafka kafka hello")], partition=0)
                time.sleep(6)
            else:
                time.sleep(1)
            seen = (tmp_path / "out.log").read_text()
        assert "('kafka', 3)" in seen and "('hello', 2)" in seen, seen[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        log.close()
