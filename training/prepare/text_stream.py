"""Streaming a prepared dataset's source text for ``data prepare`` (:mod:`training.prepare.shards`):
a file's piece read in segments cut after newlines, segments batched by size, and the batches
read ahead on a thread, so that memory stays bounded by a few batches whatever the corpus size.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Iterator
from typing import BinaryIO

import fsspec
from fsspec.implementations.local import LocalFileSystem

from training.run_objects import UnreadableObject, open_regular

#: Text per encoded segment; a segment ends after a newline when one is within it.
SEGMENT_BYTES = 64 << 10


class SourceChanged(ValueError):
    """A source file is shorter than when it was listed."""


def open_binary(path: str):
    """A binary file object of ``path`` (local or ``gs://``, through fsspec). A local one is a
    regular file, judged on its open descriptor (:func:`training.run_objects.open_regular`: a FIFO
    would block the open, a device never ends).

    Raises:
      UnreadableObject: a local path that is not a regular file, or the OS's refusal (why, not the path).
    """
    fs, inner = fsspec.core.url_to_fs(path)
    if isinstance(fs, LocalFileSystem):
        return os.fdopen(open_regular(inner), "rb")
    return fs.open(inner, "rb")


def edge(f: BinaryIO, position: int, size: int) -> int:
    """Where a piece boundary at nominal ``position`` really is: just after the first newline at
    or after ``position - 1`` (0 and ``size`` stay)."""
    if position <= 0 or position >= size:
        return max(0, min(position, size))
    f.seek(position - 1)
    offset = position - 1
    while block := f.read(64 << 10):
        found = block.find(b"\n")
        if found >= 0:
            return offset + found + 1
        offset += len(block)
    return size


def segments(path: str, start: int, end: int, size: int) -> Iterator[bytes]:
    """The text of a piece in segments of about :data:`SEGMENT_BYTES`, each cut after its last
    newline (or, in a longer line, before a UTF-8 continuation byte).

    Raises:
      UnreadableObject: a local ``path`` that is not a regular file (naming it).
    """
    try:
        opened = open_binary(path)
    except UnreadableObject as err:
        raise UnreadableObject(f"cannot read {path}: {err}") from None
    with opened as f:
        begin, stop = edge(f, start, size), edge(f, end, size)
        f.seek(begin)
        remaining, carry = stop - begin, b""
        while remaining > 0 or carry:
            block = f.read(min(SEGMENT_BYTES, remaining)) if remaining > 0 else b""
            if remaining > 0 and len(block) == 0:
                raise SourceChanged(f"{path} is shorter than when it was listed ({size} bytes); it changed while read")
            remaining -= len(block)
            text = carry + block
            if remaining <= 0:
                if text:
                    yield text
                return
            cut = text.rfind(b"\n") + 1
            if cut == 0:
                cut = len(text)
                while cut > 0 and text[cut - 1] & 0xC0 == 0x80:  # not inside a UTF-8 character
                    cut -= 1
                if cut and text[cut - 1] >= 0xC0:
                    cut -= 1
                cut = cut or len(text)
            carry = text[cut:]
            yield text[:cut]


def batches(
    files: list, pieces: list[list], stop: threading.Event, batch_bytes: int
) -> Iterator[tuple[list[bytes], list[bool]]]:
    """(segments, ends_document) batches of about ``batch_bytes`` over ``pieces``
    (``[file index, start, end, last piece of the file]``; ``files``: ``[path, relative, size]``)."""
    texts: list[bytes] = []
    ends: list[bool] = []
    size = 0
    for index, start, end, last in pieces:
        path, _, file_size = files[index]
        previous = None
        for segment in segments(path, start, end, file_size):
            if previous is not None:
                texts.append(previous)
                ends.append(False)
                size += len(previous)
            previous = segment
            if size >= batch_bytes:
                yield texts, ends
                texts, ends, size = [], [], 0
            if stop.is_set():
                return
        if previous is not None:
            texts.append(previous)
            ends.append(last)
            size += len(previous)
        elif last:  # an empty last piece still ends its document
            texts.append(b"")
            ends.append(True)
    if texts:
        yield texts, ends


def read_ahead(batches: Iterator, depth: int, stop: threading.Event) -> Iterator:
    """``batches`` produced by a thread, at most ``depth`` ahead (its errors re-raised here).
    Setting ``stop`` (the consumer failed) ends the thread."""
    buffer: queue.Queue = queue.Queue(maxsize=depth)
    done = object()

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                buffer.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in batches:
                if not put(item):
                    return
        except BaseException as err:  # handed to the consumer
            put(err)
            return
        put(done)

    thread = threading.Thread(target=produce, name="prepare-reader", daemon=True)
    thread.start()
    try:
        while (item := buffer.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()
