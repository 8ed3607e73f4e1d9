"""``codec.preload``: the kio classes, reader and writer of the APIs a client's first requests
use are loaded before a process serves (the fork server's workers inherit them), so the first
ApiVersions / Metadata / FindCoordinator a worker answers loads nothing."""

from __future__ import annotations

from shmq.protocol import api_versions, codec, kio_guard


def test_preload_leaves_nothing_to_load_for_a_client_s_first_requests() -> None:
    codec.preload()
    wanted = [(api, api_versions.SUPPORTED[api][1]) for api in codec.CLIENT_APIS]
    wanted += list(codec.CLIENT_OLDER_VERSIONS)
    assert (10, 2) in wanted and (18, 3) in wanted  # librdkafka 2.x's versions
    misses = [f.cache_info().misses for f in (codec.request_class, codec.response_class,
                                              codec._writer, kio_guard._reader)]
    for api, version in wanted:
        request = codec.request_class(api, version)
        kio_guard._reader(request)
        codec._writer(codec.response_class(api, version))
    assert [f.cache_info().misses for f in (codec.request_class, codec.response_class,
                                            codec._writer, kio_guard._reader)] == misses


def test_the_worker_preload_runs_it() -> None:
    import shmq.worker.main as worker_main

    worker_main.preload()
    assert codec.request_class.cache_info().currsize >= len(codec.CLIENT_APIS)
