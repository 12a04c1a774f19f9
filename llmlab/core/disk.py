"""Reading weights cold: drop a file's pages from the OS page cache, check that they are gone, time a read.

A "cold start" that finds its weights in the page cache reads them at memory speed, not disk speed.
`drop_page_cache` asks the kernel to evict the file's clean pages (`posix_fadvise(DONTNEED)`: no root
needed; pages another process has mapped stay), `resident_fraction` checks what is still cached
(`mincore(2)` over a mapping of the file), and `timed_read` reads the files start to end.

References:
- posix_fadvise(2), mincore(2) (Linux man-pages); the same calls `vmtouch` and util-linux `fincore` use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from pathlib import Path

CHUNK = 16 << 20  # read in 16 MiB pieces: large enough that syscalls cost nothing next to the bytes


def drop_page_cache(paths: list[Path]) -> bool:
    """Ask the kernel to drop the files' cached pages; False where posix_fadvise does not exist."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            try:
                os.fsync(fd)  # dirty pages (a file just written) are not dropped until they are on disk
            except OSError:
                pass
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def _libc():
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None


def resident_fraction(paths: list[Path]) -> float | None:
    """The share of the files' pages in the page cache (mincore over a read-only mapping); None if unknown."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mincore"):
        return None
    page = mmap.PAGESIZE
    resident = total = 0
    for p in paths:
        size = os.path.getsize(p)
        if size == 0:
            continue
        n = (size + page - 1) // page
        vec = (ctypes.c_ubyte * n)()
        with open(p, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mm:
            addr = _buffer_address(mm)  # mapping the file reads nothing: mincore only looks
            if libc.mincore(ctypes.c_void_p(addr), ctypes.c_size_t(size), vec) != 0:
                return None
        resident += sum(b & 1 for b in vec)
        total += n
    return resident / total if total else None


def _buffer_address(obj) -> int:
    """The start address of a buffer (a read-only mmap: ctypes' from_buffer wants a writable one)."""

    class Py_buffer(ctypes.Structure):  # noqa: N801 - CPython's struct name
        _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.py_object), ("len", ctypes.c_ssize_t),
                    ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                    ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                    ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]

    view = Py_buffer()
    get, release = ctypes.pythonapi.PyObject_GetBuffer, ctypes.pythonapi.PyBuffer_Release
    get.argtypes, release.argtypes = (
        [ctypes.py_object, ctypes.POINTER(Py_buffer), ctypes.c_int],
        [ctypes.POINTER(Py_buffer)],
    )
    if get(obj, ctypes.byref(view), 0) != 0:
        raise OSError("the object has no buffer")
    try:
        return int(view.buf)
    finally:
        release(ctypes.byref(view))


def timed_read(paths: list[Path], max_bytes: int | None = None) -> tuple[int, float]:
    """(bytes read, seconds): the files start to end, stopping after max_bytes."""
    n, t0 = 0, time.perf_counter()
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while max_bytes is None or n < max_bytes:
                chunk = f.read(CHUNK)
                if not chunk:
                    break
                n += len(chunk)
        if max_bytes is not None and n >= max_bytes:
            break
    return n, time.perf_counter() - t0
