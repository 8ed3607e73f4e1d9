"""The test oracles leave no socket unclosed (see ``_close_dropped_sockets`` in tests/conftest.py).

kafka-python 3.0.12 dropped the socket of a refused connect unclosed; collected in a later test,
it failed that test with a ResourceWarning.
"""

from __future__ import annotations

import gc
import logging
import socket
import warnings


def test_kafka_python_closes_the_socket_of_a_refused_connect() -> None:
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    refused = False
    # kafka-python logs each refusal with its exception, whose traceback holds the frame that
    # holds the socket; pytest keeps the log records to the end of the test, so none are made.
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            try:
                KafkaConsumer(bootstrap_servers=f"127.0.0.1:{port}", bootstrap_timeout_ms=1000)
            except KafkaError:  # not kept, for the same reason
                refused = True
            gc.collect()
    finally:
        logging.disable(logging.NOTSET)
    assert refused
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []
