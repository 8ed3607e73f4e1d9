"""``shmq.aio``: asyncio versions of ``shmq.Producer`` and ``shmq.Consumer``.

    p = shmq.aio.Producer({"bootstrap.servers": "127.0.0.1:9092"})
    delivered = await p.produce("events", b"value")     # a future ...
    msg = await delivered                               # ... of the delivered Message
    await p.flush(); await p.close()

    c = shmq.aio.Consumer({"bootstrap.servers": "127.0.0.1:9092", "group.id": "g"})
    await c.subscribe(["events"])
    msg = await c.poll(1.0)

As confluent-kafka's ``confluent_kafka.aio``: calls that may block run in a thread (one per
client, so the client is used by one thread at a time) and are awaited; ``produce`` queues the
record at once (it never blocks) and returns an ``asyncio.Future`` resolved from the delivery
report, which a background task serves (``poll``) while reports are due.  Rebalance callbacks
given to ``subscribe`` may be coroutine functions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from typing import Any

from confluent_kafka import KafkaException

from shmq.client.consumer import Consumer as _Consumer
from shmq.client.producer import Producer as _Producer

POLL_S = 0.05


class Producer:
    """Awaitable ``shmq.Producer`` (must be made inside a running event loop)."""

    def __init__(self, conf: dict[str, Any], **kwargs: Any) -> None:
        self._loop = asyncio.get_running_loop()
        self._p = _Producer(conf, **kwargs)
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "shmq-aio-producer")
        self._pending = 0
        self._poller: asyncio.Future | None = None
        self.closed = False

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def _delivered(self, fut: asyncio.Future, user_cb: Any) -> Any:
        loop = self._loop

        def report(err: Any, msg: Any) -> None:
            def settle() -> None:
                self._pending -= 1
                if not fut.done():
                    if err is not None:
                        fut.set_exception(KafkaException(err))
                    else:
                        fut.set_result(msg)
            loop.call_soon_threadsafe(settle)
            if user_cb is not None:
                user_cb(err, msg)
        return report

    async def produce(self, topic: str, value: Any = None, key: Any = None,
                      *args: Any, **kwargs: Any) -> asyncio.Future:
        """Queue one record; returns a future of the delivered ``Message`` (or raising
        ``KafkaException`` with the delivery error).  Argument errors raise here, as
        ``Producer.produce``'s do."""
        fut = self._loop.create_future()
        user_cb = kwargs.pop("on_delivery", None) or kwargs.pop("callback", None)
        kwargs["on_delivery"] = self._delivered(fut, user_cb)
        self._p.produce(topic, value, key, *args, **kwargs)
        self._pending += 1
        if self._poller is None or self._poller.done():
            self._poller = asyncio.ensure_future(self._serve())
        return fut

    async def _serve(self) -> None:
        while self._pending > 0 and not self.closed:
            await self._call(self._p.poll, POLL_S)

    async def poll(self, timeout: float = 0) -> int:
        return await self._call(self._p.poll, timeout)

    async def flush(self, timeout: float | None = None) -> int:
        return await self._call(self._p.flush, timeout)

    async def purge(self, *args: Any, **kwargs: Any) -> None:
        await self._call(self._p.purge, *args, **kwargs)

    async def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        return await self._call(self._p.list_topics, *args, **kwargs)

    async def produce_batch(self, *args: Any, **kwargs: Any) -> int:
        return await self._call(self._p.produce_batch, *args, **kwargs)

    def __len__(self) -> int:
        return len(self._p)

    async def close(self) -> None:
        if self.closed:
            return
        await self._call(self._p.close)
        self.closed = True
        if self._poller is not None:
            await asyncio.gather(self._poller, return_exceptions=True)
        self._executor.shutdown(wait=True)

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class Consumer:
    """Awaitable ``shmq.Consumer`` (must be made inside a running event loop)."""

    def __init__(self, conf: dict[str, Any], **kwargs: Any) -> None:
        self._loop = asyncio.get_running_loop()
        self._c = _Consumer(conf, **kwargs)
        self._executor = concurrent.futures.ThreadPoolExecutor(1, "shmq-aio-consumer")
        self.closed = False

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await self._loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    def _wrap(self, cb: Any) -> Any:
        """A rebalance callback, run in the consumer's thread; a coroutine function runs on
        the event loop and is waited for (the rebalance goes on after it)."""
        if cb is None:
            return None
        loop = self._loop

        def run(_c: Any, partitions: Any) -> None:
            if inspect.iscoroutinefunction(cb):
                asyncio.run_coroutine_threadsafe(cb(self, partitions), loop).result()
            else:
                cb(self, partitions)
        return run

    async def subscribe(self, topics: Any, on_assign: Any = None, on_revoke: Any = None,
                        on_lost: Any = None) -> None:
        await self._call(self._c.subscribe, topics, on_assign=self._wrap(on_assign),
                         on_revoke=self._wrap(on_revoke), on_lost=self._wrap(on_lost))

    async def poll(self, timeout: float | None = None) -> Any:
        return await self._call(self._c.poll, timeout)

    async def consume(self, num_messages: int = 1, timeout: float | None = -1) -> list[Any]:
        return await self._call(self._c.consume, num_messages, timeout)

    async def close(self) -> None:
        if self.closed:
            return
        await self._call(self._c.close)
        self.closed = True
        self._executor.shutdown(wait=True)

    def __getattr__(self, name: str) -> Any:
        """Every other ``Consumer`` method (assign, commit, committed, position, seek, pause,
        resume, get_watermark_offsets, consume_arrow, ...), awaitable."""
        if name.startswith("_"):
            raise AttributeError(name)
        fn = getattr(self._c, name)
        if not callable(fn):
            return fn

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._call(fn, *args, **kwargs)
        return call

    async def __aenter__(self) -> Consumer:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
