"""One writer, many readers: a shared-memory ring buffer, with ZMQ for
readers on other nodes (upstream: vllm/distributed/device_communicators/shm_broadcast.py).

The executor broadcasts each RPC to its workers through a `MessageQueue`, and
each worker answers through a `MessageQueue` of its own with one reader.

Ring buffer layout (`ShmRingBuffer`): `max_chunks` data chunks of
`max_chunk_bytes`, then one metadata row per chunk of 1 + n_local_reader
bytes: [written, read_by_reader_0, read_by_reader_1, ...].

* The writer takes chunk i when it was never written or every local reader
  has read it; it writes the data, clears the read flags, then sets `written`.
* Local reader r reads chunk i when `written` is set and its own flag is
  clear, then sets its flag. Writer and readers walk the chunks in order.

A chunk holds one message: byte 0 is 0 (inline) or 1 (too big: the frames
follow on the local ZMQ socket); inline data is the frame count (u32), each
frame's length (u64) and the frames. Readers on other nodes get every message
over the remote ZMQ socket. Messages are `RpcEncoder` frames (msgpack, never
pickle): a reader rejects anything else with `RpcDecodeError`.

Each MessageQueue owns its ZMQ context. `close()` (or, for a queue dropped
without it, a `weakref.finalize` at garbage collection or interpreter exit)
closes its sockets with linger 0 and then terminates the context: term()
waits until every socket of the context is closed, so a context collected in
a reference cycle before its sockets (pyzmq's own __del__ finds its socket
set already cleared then) would block forever. At interpreter exit the
queues still open are closed by `_close_queues_at_exit`, which must run before
pyzmq's own exit hook: that one stops pyzmq's garbage collector, which frees
the buffers of zero-copy frames libzmq may still be sending (an abort,
"Bad address"); atexit runs the hook registered last first, so this module
imports zmq.utils.garbage (registering pyzmq's hook) before registering its own.
"""

from __future__ import annotations

import atexit
import os
import struct
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from typing import Any

import msgspec
import zmq
import zmq.utils.garbage  # noqa: F401 (registers pyzmq's atexit hook before ours: see below)

from vllm.distributed.device_communicators.rpc_codec import RpcDecoder, RpcEncoder
from vllm.distributed.utils import get_ip
from vllm.logger import init_logger

logger = init_logger(__name__)

_INLINE, _OVERFLOW = 0, 1
_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")
_READY = b"READY"
# Queues not yet closed (their `_finalizer` still pending).
_OPEN_QUEUES: weakref.WeakSet[MessageQueue] = weakref.WeakSet()


@atexit.register
def _close_queues_at_exit() -> None:
    for mq in list(_OPEN_QUEUES):
        mq._finalizer()


class _Backoff:
    """Polling a flag: yield the CPU at first, then sleep up to 1 ms, so idle
    readers cost little on a machine with few cores."""

    def __init__(self, timeout: float | None, cancel: threading.Event | None) -> None:
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.cancel = cancel
        self.polls = 0

    def wait(self) -> None:
        self.polls += 1
        if self.cancel is not None and self.cancel.is_set():
            raise RuntimeError("cancelled")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TimeoutError("MessageQueue: timed out")
        time.sleep(0 if self.polls < 100 else min(1e-3, 1e-5 * (self.polls - 99)))


class ShmRingBuffer:
    """`max_chunks` chunks in one shared-memory segment (layout: module docstring)."""

    def __init__(
        self, n_reader: int, max_chunk_bytes: int, max_chunks: int, name: str | None = None
    ) -> None:
        self.n_reader = n_reader
        self.metadata_size = 1 + n_reader
        self.max_chunk_bytes = max_chunk_bytes
        self.max_chunks = max_chunks
        self.data_offset = 0
        self.metadata_offset = max_chunk_bytes * max_chunks
        size = (max_chunk_bytes + self.metadata_size) * max_chunks
        self.is_creator = name is None
        if self.is_creator:
            self.shared_memory = shared_memory.SharedMemory(create=True, size=size)
            self._buf()[self.metadata_offset : size] = bytes(self.metadata_size * max_chunks)
        else:
            # Python < 3.13 registers an attached segment with the resource
            # tracker too; processes we spawn share ours, where it is one entry
            # that the creator's unlink removes.
            self.shared_memory = shared_memory.SharedMemory(name=name)

    def handle(self) -> tuple[int, int, int, str]:
        return self.n_reader, self.max_chunk_bytes, self.max_chunks, self.shared_memory.name

    def _buf(self) -> memoryview:
        buf = self.shared_memory.buf
        assert buf is not None, "the segment is closed"
        return buf

    def get_data(self, i: int) -> memoryview:
        start = self.data_offset + i * self.max_chunk_bytes
        return self._buf()[start : start + self.max_chunk_bytes]

    def get_metadata(self, i: int) -> memoryview:
        start = self.metadata_offset + i * self.metadata_size
        return self._buf()[start : start + self.metadata_size]

    def close(self, unlink: bool | None = None) -> None:
        """Unmap the segment; unlink it too if `unlink` (default: if we created it)."""
        # BufferError: a view is still in use (a reader being cancelled on
        # another thread); the mapping goes away with the process.
        with suppress(BufferError):
            self.shared_memory.close()
        if self.is_creator if unlink is None else unlink:
            with suppress(FileNotFoundError):
                self.shared_memory.unlink()


@dataclass
class Handle:
    """What a reader needs to attach to a MessageQueue (msgpack-serializable)."""

    local_reader_ranks: list[int] = field(default_factory=list)
    buffer_handle: tuple[int, int, int, str] | None = None
    local_subscribe_addr: str | None = None
    remote_subscribe_addr: str | None = None


class MessageQueue:
    """Broadcast from one writer to `n_reader` readers, of which the
    `n_local_reader` on this node (ranks `local_reader_ranks`) read from shared
    memory. The writer is built directly; readers with `create_from_handle`."""

    encoder: RpcEncoder  # the writer's
    decoder: RpcDecoder  # a reader's
    local_socket: zmq.Socket[bytes] | None
    remote_socket: zmq.Socket[bytes] | None

    def __init__(
        self,
        n_reader: int,
        n_local_reader: int,
        local_reader_ranks: list[int] | None = None,
        max_chunk_bytes: int = 10 * 1024 * 1024,
        max_chunks: int = 10,
        connect_ip: str | None = None,
    ) -> None:
        if local_reader_ranks is None:
            local_reader_ranks = list(range(n_local_reader))
        if len(local_reader_ranks) != n_local_reader:
            raise ValueError("local_reader_ranks must list n_local_reader ranks.")
        self.n_local_reader = n_local_reader
        self.n_remote_reader = n_reader - n_local_reader
        self._is_writer = True
        self._is_local_reader = self._is_remote_reader = False
        self.local_reader_rank = -1
        self.current_idx = 0
        self.encoder = RpcEncoder()
        self.context = zmq.Context()
        self.buffer: ShmRingBuffer | None = None
        self.local_socket = self.remote_socket = None
        local_addr = remote_addr = None
        if n_local_reader > 0:
            self.buffer = ShmRingBuffer(n_local_reader, max_chunk_bytes, max_chunks)
            self.local_socket = self._socket(zmq.XPUB)
            local_addr = f"ipc://{tempfile.gettempdir()}/vllm-mq-{uuid.uuid4().hex}"
            self.local_socket.bind(local_addr)
        if self.n_remote_reader > 0:
            ip = connect_ip or get_ip()
            self.remote_socket = self._socket(zmq.XPUB)
            port = self.remote_socket.bind_to_random_port(f"tcp://{ip}")
            remote_addr = f"tcp://{ip}:{port}"
        self.handle = Handle(
            local_reader_ranks,
            self.buffer.handle() if self.buffer else None,
            local_addr,
            remote_addr,
        )
        self._finalizer = self._release_on_collect()

    def _socket(self, kind: int) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        if kind == zmq.XPUB:
            sock.setsockopt(zmq.XPUB_VERBOSE, True)
        return sock

    def export_handle(self) -> Handle:
        return self.handle

    @staticmethod
    def create_from_handle(handle: Handle, rank: int) -> MessageQueue:
        """The reader of global rank `rank` (local if `rank` is a local reader rank)."""
        self = MessageQueue.__new__(MessageQueue)
        self.handle = handle
        self._is_writer = False
        self.current_idx = 0
        self.decoder = RpcDecoder()
        self.context = zmq.Context()
        self.buffer = None
        self.local_socket = self.remote_socket = None
        self._is_local_reader = rank in handle.local_reader_ranks
        self._is_remote_reader = not self._is_local_reader
        if self._is_local_reader:
            assert handle.buffer_handle is not None
            self.local_reader_rank = handle.local_reader_ranks.index(rank)
            self.buffer = ShmRingBuffer(*handle.buffer_handle)
            self.local_socket = self._subscriber(handle.local_subscribe_addr)
        else:
            self.local_reader_rank = -1
            self.remote_socket = self._subscriber(handle.remote_subscribe_addr)
        self._finalizer = self._release_on_collect()
        return self

    def _release_on_collect(self) -> weakref.finalize:
        """Close the sockets and terminate the context when this queue is
        collected or the interpreter exits (`close()` runs it at once). The
        callback holds the sockets and the context, never the queue."""
        sockets = [s for s in (self.local_socket, self.remote_socket) if s is not None]
        _OPEN_QUEUES.add(self)
        return weakref.finalize(self, _release_zmq, sockets, self.context, os.getpid())

    def _subscriber(self, addr: str | None) -> zmq.Socket:
        assert addr is not None
        sock = self.context.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        sock.connect(addr)
        return sock

    def wait_until_ready(
        self, timeout: float | None = None, cancel: threading.Event | None = None
    ) -> None:
        """Writer: wait for every reader's ZMQ subscription, then say READY.
        Reader: wait for READY. Messages sent before would be lost. `cancel`
        set (e.g. a reader process died): RuntimeError("cancelled")."""
        if self._is_writer:
            for sock, n in (
                (self.local_socket, self.n_local_reader),
                (self.remote_socket, self.n_remote_reader),
            ):
                for _ in range(n if sock is not None else 0):
                    self._recv(sock, timeout, cancel)  # a subscription message
                if sock is not None:
                    sock.send(_READY)
        else:
            sock = self.local_socket if self._is_local_reader else self.remote_socket
            if self._recv(sock, timeout, cancel)[0] != _READY:
                raise RuntimeError("MessageQueue: expected READY")

    @staticmethod
    def _recv(sock: Any, timeout: float | None, cancel: threading.Event | None) -> list[bytes]:
        backoff = _Backoff(timeout, cancel)
        while not sock.poll(timeout=10):
            backoff.wait()
        return sock.recv_multipart()

    # ---- writing --------------------------------------------------------------------
    def enqueue(
        self, obj: Any, timeout: float | None = None, cancel: threading.Event | None = None
    ) -> None:
        """Send `obj` (any RPC value) to every reader. Waits while the ring is
        full; raises TimeoutError after `timeout`, RuntimeError if `cancel` is set."""
        assert self._is_writer, "only the writer enqueues"
        self._write_frames(self.encoder.encode(obj), timeout, cancel)

    def _write_frames(
        self,
        frames: Sequence[bytes | bytearray | memoryview],
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        views = [memoryview(f).cast("B") for f in frames]
        header = _COUNT.size + _LENGTH.size * len(views)
        if self.buffer is not None:
            overflow = 1 + header + sum(len(v) for v in views) > self.buffer.max_chunk_bytes
            with self._acquire_write(timeout, cancel) as chunk:
                chunk[0] = _OVERFLOW if overflow else _INLINE
                if not overflow:
                    _pack_frames(chunk, views)
            if overflow:
                assert self.local_socket is not None  # it comes with the buffer
                self.local_socket.send_multipart(views, copy=False)
        if self.remote_socket is not None:
            self.remote_socket.send_multipart(views, copy=False)

    @contextmanager
    def _acquire_write(
        self, timeout: float | None, cancel: threading.Event | None
    ) -> Iterator[memoryview]:
        assert self.buffer is not None
        backoff = _Backoff(timeout, cancel)
        # Views are released as soon as they are used (`with`): a live view
        # keeps the segment from being closed.
        while True:
            with self.buffer.get_metadata(self.current_idx) as metadata:
                busy = metadata[0] and sum(metadata[1:]) != self.n_local_reader
            if busy:
                backoff.wait()  # not every reader has read this chunk yet
                continue
            with self.buffer.get_data(self.current_idx) as chunk:
                yield chunk
            with self.buffer.get_metadata(self.current_idx) as metadata:
                metadata[1:] = bytes(self.n_local_reader)  # clear the read flags ...
                metadata[0] = 1  # ... then publish
            self.current_idx = (self.current_idx + 1) % self.buffer.max_chunks
            return

    # ---- reading --------------------------------------------------------------------
    def dequeue(self, timeout: float | None = None, cancel: threading.Event | None = None) -> Any:
        """The next message. Raises TimeoutError after `timeout` seconds,
        RuntimeError when `cancel` is set, RpcDecodeError on a malformed one."""
        assert not self._is_writer, "the writer does not dequeue"
        if self._is_remote_reader:
            return self.decoder.decode(self._recv(self.remote_socket, timeout, cancel))
        with self._acquire_read(timeout, cancel) as chunk:
            if chunk[0] == _OVERFLOW:
                return self.decoder.decode(self._recv(self.local_socket, timeout, cancel))
            frames = _unpack_frames(chunk)
            try:
                return self.decoder.decode(frames)
            finally:
                for frame in frames:
                    frame.release()

    @contextmanager
    def _acquire_read(
        self, timeout: float | None, cancel: threading.Event | None
    ) -> Iterator[memoryview]:
        assert self.buffer is not None
        backoff = _Backoff(timeout, cancel)
        flag = 1 + self.local_reader_rank
        while True:
            with self.buffer.get_metadata(self.current_idx) as metadata:
                ready = metadata[0] and not metadata[flag]
            if not ready:
                backoff.wait()  # nothing new in this chunk yet
                continue
            try:
                with self.buffer.get_data(self.current_idx) as chunk:
                    yield chunk
            finally:
                # Even a message that failed to decode is consumed.
                with self.buffer.get_metadata(self.current_idx) as metadata:
                    metadata[flag] = 1
                self.current_idx = (self.current_idx + 1) % self.buffer.max_chunks
            return

    def close(self, unlink: bool | None = None) -> None:
        """Close the sockets and the buffer. A reader passes `unlink=True` to
        remove a segment whose writer died without doing so."""
        self._finalizer()
        _OPEN_QUEUES.discard(self)
        if self.buffer is not None:
            self.buffer.close(unlink)
            self.buffer = None


def _release_zmq(sockets: list[zmq.Socket], context: zmq.Context, pid: int) -> None:
    """Sockets first (linger 0: unsent messages are dropped), then the
    context, whose term() returns once they are closed. A forked child
    (another pid) owns none of them: pyzmq ignores its calls there too."""
    if os.getpid() != pid:
        return
    for sock in sockets:
        sock.close(linger=0)
    context.term()


def _pack_frames(chunk: memoryview, views: list[memoryview]) -> None:
    """chunk[1:] = u32 count, u64 lengths, frames."""
    pos = 1
    _COUNT.pack_into(chunk, pos, len(views))
    pos += _COUNT.size
    for v in views:
        _LENGTH.pack_into(chunk, pos, len(v))
        pos += _LENGTH.size
    for v in views:
        chunk[pos : pos + len(v)] = v
        pos += len(v)


def _unpack_frames(chunk: memoryview) -> list[memoryview]:
    pos = 1
    (count,) = _COUNT.unpack_from(chunk, pos)
    pos += _COUNT.size
    if _COUNT.size + count * _LENGTH.size > len(chunk):
        raise ValueError("MessageQueue: corrupt chunk header")
    lengths = [_LENGTH.unpack_from(chunk, pos + i * _LENGTH.size)[0] for i in range(count)]
    pos += count * _LENGTH.size
    frames = []
    for n in lengths:
        if pos + n > len(chunk):
            raise ValueError("MessageQueue: corrupt chunk header")
        frames.append(chunk[pos : pos + n])
        pos += n
    return frames


def encode_handle(handle: Handle) -> bytes:
    return msgspec.msgpack.encode(handle)


def decode_handle(data: bytes) -> Handle:
    return msgspec.msgpack.decode(data, type=Handle)


__all__ = ["Handle", "MessageQueue", "ShmRingBuffer", "decode_handle", "encode_handle"]
