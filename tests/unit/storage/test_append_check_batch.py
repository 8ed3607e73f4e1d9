"""``_fast.check_batch`` (pass 1 of ``PartitionLog.append`` in one compiled call) and
``_fast.write_stamped`` (one batch written from C) against their pure-Python twins, and the log
they write against the log the twins write.

Batches come from kafka-python's builder (``kbatch``), then are mutated at random, with the CRC
redone for half of them so the checks behind the CRC (counts, sequence, control, records,
timestamps) are reached.  Both must give the same result or the same exception class and message;
whole appends must give the same answers and the same bytes on disk.
"""

from __future__ import annotations

import errno
import os
import random
import struct
import time

import crc32c
import pytest
from _storage_util import kbatch

import shmq._fast as fast
from shmq._fast import _reference as ref
from shmq.errors import KafkaApiError, ShmqError
from shmq.storage.log import PartitionLog
from shmq.storage.log_config import LogConfig

if not fast.HAVE_FAST:
    pytest.skip("compiled shmq._fast extensions are not loaded", allow_module_level=True)

from shmq._fast import batch as compiled  # noqa: E402

NOW = 1_700_000_100_000
DAY = 86_400_000


def _recrc(data: bytearray) -> bytearray:
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return data


def _valid_batches(rng: random.Random) -> list[bytes]:
    out = []
    for i in range(40):
        n = rng.randint(1, 5)
        ts = [NOW + rng.choice((0, 0, 0, -5, 7, -2 * DAY, 3 * DAY, -NOW - 1)) + j for j in range(n)]
        pid = rng.choice((-1, 7, rng.randint(8, 1 << 40), rng.randint(8, 1 << 40)))
        batch = bytearray(kbatch(
            [b"v" * rng.randint(0, 300) if rng.random() < 0.9 else None for _ in range(n)], ts,
            key=rng.choice((None, b"k")), compression=rng.choice((0, 0, 0, 1)),
            producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
            base_sequence=rng.randint(0, 1000) if pid >= 0 else -1))
        kind = i % 5
        if kind == 1:  # the LogAppendTime attribute, as some clients wrongly send it
            struct.pack_into(">h", batch, 21, struct.unpack_from(">h", batch, 21)[0] | 0x08)
            _recrc(batch)
        elif kind == 2:  # a maxTimestamp that is not its records'
            struct.pack_into(">q", batch, 35, NOW - 123)
            _recrc(batch)
        elif kind == 3:  # a leader epoch and base offset, outside the CRC
            struct.pack_into(">qii", batch, 0, rng.randint(0, 1 << 40), len(batch) - 12, 9)
        out.append(bytes(batch))
    return out


def _garbage(rng: random.Random, valid: list[bytes]) -> list[bytes]:
    out = []
    for _ in range(400):
        data = bytearray(rng.choice(valid))
        for _ in range(rng.randint(1, 3)):
            action = rng.random()
            if action < 0.6 and data:
                at = rng.choice((8, 9, 10, 11, 16, 21, 22, 23, 26, 27, 35, 43, 51, 53, 56, 57, 60,
                                 61, 62, 63, 64, 65, 66, 67, rng.randrange(len(data))))
                if at < len(data):
                    data[at] = rng.randrange(256)
            elif action < 0.8:
                del data[rng.randrange(len(data) + 1):]
            else:
                data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 40)))
        if rng.random() < 0.5 and len(data) >= 61:
            _recrc(data)
        out.append(bytes(data))
    return out


def _outcome(fn, *args):  # noqa: ANN001, ANN202
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001  (the class and message are compared)
        return type(exc).__name__, str(exc)


def test_check_batch_matches_its_twin() -> None:
    rng = random.Random(14)
    valid = _valid_batches(rng)
    cases = valid + _garbage(rng, valid)
    kinds = set()
    for data in cases:
        for pos, buf in ((0, data), (5, b"\0" * 5 + data)):
            for limit in (1 << 20, 100):
                for validate in (True, False):
                    for create_time in (True, False):
                        args = (memoryview(buf), pos, limit, validate, create_time, NOW, DAY, DAY)
                        got = _outcome(compiled.check_batch, *args)
                        want = _outcome(ref.check_batch, *args)
                        assert got == want, (data.hex(), args[1:])
                        kinds.add(got[0] if got[0] != "ok" else
                                  ("ok", got[1][4] if got[1][8] is None else "errors"))
    # every way out was taken: plain, rewritten, compressed, timestamp errors, both exceptions
    assert {("ok", -1), ("ok", fast.TIMESTAMPS_UNCHECKED), ("ok", "errors"),
            "CorruptRecordError", "InvalidRecordError"} <= kinds, kinds
    assert any(isinstance(k, tuple) and k[0] == "ok" and isinstance(k[1], int) and k[1] >= 0
               for k in kinds), kinds


def _append_all(tmp_path, name: str, batches: list[bytes], config: LogConfig,
                monkeypatch: pytest.MonkeyPatch, twin: bool) -> tuple[list, bytes]:
    with monkeypatch.context() as m:
        if twin:
            m.setattr(fast, "check_batch", ref.check_batch)
            m.setattr(fast, "write_stamped", ref.write_stamped)
        log = PartitionLog.open(tmp_path / name, config)
        answers = []
        try:
            for i, data in enumerate(batches):
                try:
                    info = log.append(data, leader_epoch=i // 50, now_ms=NOW + i)
                    answers.append(("ok", tuple(info)))
                except ShmqError as exc:
                    answers.append((type(exc).__name__, getattr(exc, "code", None), str(exc),
                                    getattr(exc, "record_errors", None)))
            seg = log.active_segment
            return answers, seg.read_bytes(0, seg.size)
        finally:
            log.close()


@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_appends_match_the_twins(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                 timestamp_type: str) -> None:
    """Valid and garbage batches, one request each and sometimes two in one append: the same
    answers (offsets, errors, duplicates) and the same log bytes with either pass 1."""
    rng = random.Random(17)
    valid = _valid_batches(rng)
    stream = []
    for data in _garbage(rng, valid)[:150] + valid + valid[:10]:  # the repeats are duplicates
        stream.append(data)
        if rng.random() < 0.1:
            stream.append(data + rng.choice(valid))
    rng.shuffle(stream)
    config = LogConfig(message_timestamp_type=timestamp_type, max_message_bytes=1_000)
    fast_answers, fast_bytes = _append_all(tmp_path, "f-0", stream, config, monkeypatch, False)
    twin_answers, twin_bytes = _append_all(tmp_path, "t-0", stream, config, monkeypatch, True)
    assert fast_answers == twin_answers
    assert fast_bytes == twin_bytes
    assert sum(a[0] == "ok" for a in fast_answers) > 20
    assert {a[0] for a in fast_answers} >= {"ok", "CorruptRecordError", "InvalidRecordError",
                                            "RecordTooLargeError", "InvalidTimestampError"}


def test_timestamp_rejections_keep_kafkas_answer(tmp_path) -> None:
    """The compiled pass keeps INVALID_TIMESTAMP's per-record errors and MESSAGE_TOO_LARGE's
    precedence over them."""
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(max_message_bytes=300,
                                                           message_timestamp_before_max_ms=DAY))
    try:
        now = int(time.time() * 1000)
        bad = kbatch([b"a", b"b"], [now, now - 30 * DAY])
        with pytest.raises(KafkaApiError) as caught:
            log.append(bad)
        assert caught.value.code == 32
        assert [i for i, _ in caught.value.record_errors] == [1]  # type: ignore[attr-defined]
        with pytest.raises(KafkaApiError) as caught:
            log.append(kbatch([b"x" * 400], [now - 30 * DAY]))
        assert caught.value.code == 10
        assert log.log_end_offset == 0
    finally:
        log.close()


def test_write_stamped_matches_its_twin(tmp_path) -> None:
    rng = random.Random(3)
    valid = _valid_batches(rng)
    files = {}
    for name, write in (("c", compiled.write_stamped), ("py", ref.write_stamped)):
        fd = os.open(tmp_path / name, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            at = 0
            for i, data in enumerate(valid):
                pad = b"\xff" * (i % 3)
                assert write(fd, at, pad + data + pad, len(pad), len(data), 1000 + i * 7,
                             i - 1) == len(data)
                at += len(data)
            for args in ((at, b"\0" * 60, 0, 60), (at, valid[0], 1, len(valid[0])),
                         (at, valid[0], -1, len(valid[0]))):
                with pytest.raises(ValueError):
                    write(fd, *args, 0, 0)
        finally:
            os.close(fd)
        with pytest.raises(OSError) as bad:
            write(fd, 0, valid[0], 0, len(valid[0]), 0, 0)  # closed
        assert bad.value.errno == errno.EBADF
        files[name] = (tmp_path / name).read_bytes()
    assert files["c"] == files["py"]
    at = 0
    for i, data in enumerate(valid):  # the client's bytes, offset and epoch stamped
        stored = files["c"][at : at + len(data)]
        assert struct.unpack_from(">qii", stored) == (1000 + i * 7, len(data) - 12, i - 1)
        assert stored[16:] == data[16:]
        at += len(data)
    assert at == len(files["c"])


_SHORT_WRITE = """
import resource, signal, sys
from shmq._fast import _reference as ref
from shmq._fast import batch
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past RLIMIT_FSIZE: a short write, then EFBIG
path, limit, impl = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = bytes(range(256)) * 2
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
try:
    (batch if impl == "c" else ref).write_stamped(fd, 100, data, 0, len(data), 5, 6)
except OSError as exc:
    print(exc.errno)
"""


@pytest.mark.parametrize("limit", [108, 116, 117, 400])
def test_write_stamped_short_writes_end_as_the_twins(tmp_path, limit: int) -> None:
    """A write cut short by RLIMIT_FSIZE (in the prefix, at its end, in the body) goes on from
    where it stopped, then raises the OSError that stopped it: the same bytes and errno as the
    twin's (``append_one`` then truncates)."""
    import subprocess
    import sys

    out = {}
    for impl in ("c", "py"):
        path = tmp_path / impl
        run = subprocess.run([sys.executable, "-c", "import os\n" + _SHORT_WRITE, str(path),
                              str(limit), impl], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        out[impl] = (run.stdout.strip(), path.read_bytes())
    assert out["c"] == out["py"]
    assert out["c"][0] == str(errno.EFBIG) and len(out["c"][1]) == limit
