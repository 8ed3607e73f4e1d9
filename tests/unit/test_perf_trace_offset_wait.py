"""perf/trace_offset_wait.py's reading of a librdkafka trace: the query -> reply time of each
partition's offset lookup, and when the late lookups' ListOffsets reached the socket."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

PERF = Path(__file__).resolve().parents[2] / "perf"

TRACE = """\
%7|100.000|OFFREQ|rdkafka#consumer-1| [thrd:main]: b:1/1: Partition t [0]: querying for logical offset BEGINNING (opv 2)
%7|100.001|OFFREQ|rdkafka#consumer-1| [thrd:main]: b:1/1: Partition t [1]: querying for logical offset BEGINNING (opv 2)
%7|100.002|SEND|rdkafka#consumer-1| [thrd:b:1/1]: b:1/1: Sent ListOffsetsRequest (v7, 51 bytes @ 0, CorrId 2)
%7|100.010|RECV|rdkafka#consumer-1| [thrd:b:1/1]: b:1/1: Received ListOffsetsResponse (v7, 39 bytes, CorrId 2, rtt 8.00ms)
%7|100.011|OFFSET|rdkafka#consumer-1| [thrd:main]: b:1/1: Offset reply for topic t [0] (v2 vs v2)
%7|112.000|SEND|rdkafka#consumer-1| [thrd:b:1/1]: b:1/1: Sent ListOffsetsRequest (v7, 51 bytes @ 0, CorrId 9)
%7|112.050|RECV|rdkafka#consumer-1| [thrd:b:1/1]: b:1/1: Received ListOffsetsResponse (v7, 39 bytes, CorrId 9, rtt 50.00ms)
%7|112.051|OFFSET|rdkafka#consumer-1| [thrd:main]: b:1/1: Offset reply for topic t [1] (v2 vs v2)
"""


@pytest.fixture
def trace(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(PERF))
    import trace_offset_wait

    return trace_offset_wait


def test_a_lookup_held_in_the_client_is_reported(trace: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "rd.log"
    log.write_text(TRACE)
    out = trace.analyse(log)
    assert "offset queries 2;" in out
    assert "slowest 12.05 s" in out and "over 1 s: 1" in out
    assert "written to the socket 12.00-12.00 s after the first query" in out
    assert "broker RTT from the write 50-50 ms" in out


def test_no_lookups(trace: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "rd.log"
    log.write_text("")
    assert trace.analyse(log) == "no offset queries in the trace"
