"""Cython hot paths (a leaf: imports nothing from shmq) with a pure-Python twin.

``HAVE_FAST`` tells whether the compiled modules loaded; set ``SHMQ_PURE=1`` to force the twin.
Every public name below exists in both ``batch``/``crc32c``/``index`` and ``_reference``.
"""

from __future__ import annotations

import os

from shmq._fast import (
    _client_reference,
    _metrics_reference,
    _producers_reference,
    _reference,
    _ring_reference,
    _seqlock_reference,
    _worker_ring_reference,
)

HAVE_FAST = False
if not os.environ.get("SHMQ_PURE"):
    try:
        from shmq._fast import batch as _batch
        from shmq._fast import client as _client
        from shmq._fast import crc32c as _crc
        from shmq._fast import index as _index
        from shmq._fast import mapping as _mapping
        from shmq._fast import metrics as _metrics
        from shmq._fast import producers as _producers
        from shmq._fast import ring as _ring
        from shmq._fast import seqlock as _seqlock
        from shmq._fast import wire as _wire  # noqa: F401  (used by shmq.protocol)
        from shmq._fast import worker_ring as _worker_ring

        HAVE_FAST = True
    except ImportError:  # not built: fall back to the twin
        pass

if HAVE_FAST:
    crc32c = _crc.crc32c
    crc32c_software = _crc.crc32c_software
    have_hardware = _crc.have_hardware
    have_folding = _crc.have_folding
    validate_batch = _batch.validate_batch
    batch_header = _batch.batch_header
    stamp_batch = _batch.stamp_batch
    scan_batches = _batch.scan_batches
    decode_records = _batch.decode_records
    check_timestamps = _batch.check_timestamps
    check_batch = _batch.check_batch
    write_stamped = _batch.write_stamped
    TIMESTAMPS_UNCHECKED = _batch.TIMESTAMPS_UNCHECKED
    decode_sections = _batch.decode_sections
    encode_records = _batch.encode_records
    build_batch = _batch.build_batch
    fill_columns = _batch.fill_columns
    fill_headers = _batch.fill_headers
    murmur2_partitions = _batch.murmur2_partitions
    encode_arrow_batch_into = _batch.encode_arrow_batch_into
    import_spark_batch = _batch.import_spark_batch
    largest_lower_bound = _index.largest_lower_bound
    smallest_upper_bound = _index.smallest_upper_bound
    MappedFile = _mapping.MappedFile
    read_slot = _seqlock.read_slot
    write_slot = _seqlock.write_slot
    slot_seq = _seqlock.slot_seq
    MetricsWriter = _metrics.MetricsWriter
    wait_slot = _seqlock.wait_slot
    wait_bound = _seqlock.wait_bound
    ring = _ring
    ProducerTable = _producers.ProducerTable
    murmur2 = _client.murmur2
    murmur2_partition = _client.murmur2_partition
    Batch = _client.Batch
    ProducerCore = _client.ProducerCore
    ConsumerCore = _client.ConsumerCore
    bytes_stats = _client.bytes_stats
    WorkerRings = _worker_ring.WorkerRings
else:
    crc32c = _reference.crc32c
    crc32c_software = _reference.crc32c_software
    have_hardware = _reference.have_hardware
    have_folding = _reference.have_folding
    validate_batch = _reference.validate_batch
    batch_header = _reference.batch_header
    stamp_batch = _reference.stamp_batch
    scan_batches = _reference.scan_batches
    decode_records = _reference.decode_records
    check_timestamps = _reference.check_timestamps
    check_batch = _reference.check_batch
    write_stamped = _reference.write_stamped
    TIMESTAMPS_UNCHECKED = _reference.TIMESTAMPS_UNCHECKED
    decode_sections = _reference.decode_sections
    encode_records = _reference.encode_records
    build_batch = _reference.build_batch
    fill_columns = _reference.fill_columns
    fill_headers = _reference.fill_headers
    murmur2_partitions = _reference.murmur2_partitions
    encode_arrow_batch_into = _reference.encode_arrow_batch_into
    import_spark_batch = _reference.import_spark_batch
    largest_lower_bound = _reference.largest_lower_bound
    smallest_upper_bound = _reference.smallest_upper_bound
    MappedFile = _reference.MappedFile  # type: ignore[misc,assignment]
    read_slot = _seqlock_reference.read_slot
    write_slot = _seqlock_reference.write_slot
    slot_seq = _seqlock_reference.slot_seq
    MetricsWriter = _metrics_reference.MetricsWriter  # type: ignore[misc,assignment]
    wait_slot = _seqlock_reference.wait_slot
    wait_bound = _seqlock_reference.wait_bound
    ring = _ring_reference  # type: ignore[misc,assignment]
    ProducerTable = _producers_reference.ProducerTable  # type: ignore[misc,assignment]
    murmur2 = _client_reference.murmur2
    murmur2_partition = _client_reference.murmur2_partition
    Batch = _client_reference.Batch  # type: ignore[misc,assignment]
    ProducerCore = _client_reference.ProducerCore  # type: ignore[misc,assignment]
    ConsumerCore = _client_reference.ConsumerCore  # type: ignore[misc,assignment]
    bytes_stats = _client_reference.bytes_stats
    WorkerRings = _worker_ring_reference.WorkerRings  # type: ignore[misc,assignment]

from shmq._fast._reference import (  # noqa: E402  (constants are shared)
    COL_ATTRIBUTES,
    COL_BASE_OFFSET,
    COL_BASE_SEQUENCE,
    COL_BASE_TIMESTAMP,
    COL_LAST_OFFSET,
    COL_LEADER_EPOCH,
    COL_MAX_TIMESTAMP,
    COL_POSITION,
    COL_PRODUCER_EPOCH,
    COL_PRODUCER_ID,
    COL_RECORDS_COUNT,
    COL_SIZE,
    HEADER_SIZE,
    NO_LOG_APPEND_TIME,
    SCAN_COLUMNS,
    SCAN_CORRUPT,
    SCAN_END,
    SCAN_FULL,
    SCAN_PARTIAL,
)
from shmq._fast._seqlock_reference import DEFAULT_MAX_SPINS, SLOT_SIZE  # noqa: E402

__all__ = [
    "MetricsWriter", "WorkerRings",
    "DEFAULT_MAX_SPINS", "SLOT_SIZE", "read_slot", "ring", "slot_seq", "wait_bound", "wait_slot", "write_slot",
    "COL_ATTRIBUTES", "COL_BASE_OFFSET", "COL_BASE_SEQUENCE", "COL_BASE_TIMESTAMP",
    "COL_LAST_OFFSET", "COL_LEADER_EPOCH", "COL_MAX_TIMESTAMP", "COL_POSITION",
    "COL_PRODUCER_EPOCH", "COL_PRODUCER_ID", "COL_RECORDS_COUNT", "COL_SIZE", "HAVE_FAST",
    "HEADER_SIZE", "MappedFile", "ProducerTable", "NO_LOG_APPEND_TIME", "SCAN_COLUMNS", "SCAN_CORRUPT", "SCAN_END", "SCAN_FULL", "SCAN_PARTIAL",
    "batch_header", "build_batch", "check_batch", "check_timestamps", "TIMESTAMPS_UNCHECKED", "crc32c", "crc32c_software",
    "decode_records", "decode_sections", "encode_records", "fill_columns", "fill_headers", "murmur2_partitions", "encode_arrow_batch_into", "have_hardware", "have_folding", "largest_lower_bound",
    "Batch", "ConsumerCore", "ProducerCore", "bytes_stats", "murmur2", "murmur2_partition",
    "scan_batches", "smallest_upper_bound", "stamp_batch", "validate_batch", "write_stamped",
]
