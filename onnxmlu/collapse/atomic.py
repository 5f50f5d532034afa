"""Atomic model writes: the destination holds the previous complete file or the new one.

A fuse killed while saving (SIGKILL, power loss, Ctrl-C) must never leave a truncated model
where the user expects one. Every write goes to a temporary name in the destination's own
folder (same filesystem, so the final ``os.replace`` is an atomic rename), is flushed and
fsync'ed, then renamed over the destination; the folder is fsync'ed so the rename itself
survives a crash. An exception or KeyboardInterrupt removes the temporary file; after a
SIGKILL a hidden ``.NAME.*.tmp`` file may remain next to the destination, never in its place.

Models whose tensors exceed protobuf's 2 GB limit (or when asked) are written with their
tensors in one external data file ``NAME.data`` next to ``NAME`` — block bodies included,
through ``convert_attribute=True``. Both files are written and fsync'ed in a private temporary
folder beside the destination (``.NAME.*.tmp/``), then renamed in this order:

1. the old ``NAME``, then the old ``NAME.data``, move into that folder (so an old model can
   never be paired with new data);
2. the new ``NAME.data`` is renamed into place;
3. the new ``NAME`` is renamed into place: the commit point.

An exception or KeyboardInterrupt before the commit point moves the old pair back. A SIGKILL
or power loss leaves the old model with its data, or no ``NAME`` at all (the old pair then
sits in the hidden temporary folder; a new ``NAME.data`` may sit without its model), or the
new model with its data — never a model with the wrong or a truncated data file.
"""

from __future__ import annotations

import os
import queue
import shutil
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, TypeVar

import onnx

from onnxmlu.errors import OnnxMluError
from onnxmlu.ir import copy_model, wire
from onnxmlu.ir.weights import tensor_payload_bytes

T = TypeVar("T")
#: Buffers smaller than this are gathered into one ``write``.
GATHER_BYTES = 2**20
#: Larger buffers are written this much at a time, and the disk is handed each slice once
#: written (flush-behind), so the disk works while the rest is made and the final fsync waits
#: for one slice. Save phase, 7 runs side by side, 32 MiB -> 2 MiB slices: MobileNetV2 0.03 ->
#: 0.02 s, ResNet-18 0.04 -> 0.03, ResNet-50 0.07 -> 0.06, AlexNet 0.17 -> 0.13, VGG-19 0.32 -> 0.29.
SLICE_BYTES = 2**21
#: Batches the thread making the pieces' buffers may run ahead of the writer. A batch holds one
#: large buffer at most, and a transposed weight's copies are made ``wire.CHUNK_BYTES`` at a
#: time, so this bounds what the overlap adds to the peak.
AHEAD_BATCHES = 8
#: Small items handed over between the threads at once.
BATCH_ITEMS = 256

#: Models whose tensors hold more than this are saved with external data. protobuf's limit is
#: 2 GiB for the whole message; the margin covers everything that is not tensor data.
EXTERNAL_DATA_THRESHOLD = 2**31 - 2**26


def external_data_name(path: str | os.PathLike) -> str:
    """The external data file that goes with a model file: ``NAME.data`` in the same folder."""
    return Path(path).name + ".data"


def needs_external_data(model: onnx.ModelProto) -> bool:
    return tensor_payload_bytes(model) > EXTERNAL_DATA_THRESHOLD


def check_destination(out: Path) -> Path:
    """The destination's folder, or a one-line error when ``out`` cannot be written."""
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        raise OnnxMluError(f"output folder {folder} does not exist")
    if out.is_dir():
        raise OnnxMluError(f"output {out} is a directory; give a file name")
    if not os.access(folder, os.W_OK):
        raise OnnxMluError(f"output folder {folder} is not writable")
    return folder


def write_bytes_atomic(data: bytes, out: Path) -> None:
    """Write ``data`` to ``out``: temporary file, fsync, rename, fsync of the folder."""
    write_pieces_atomic([data], out)


def write_pieces_atomic(pieces: Iterable[wire.Piece], out: Path) -> None:
    """Write the bytes of ``pieces`` (:mod:`onnxmlu.ir.wire`) to ``out`` like
    :func:`write_bytes_atomic`. A thread makes the pieces' buffers (copies of transposed
    weights, protobuf's bytes) and takes the bodies' digests a few items ahead of this one,
    which writes them and drops each buffer once written: a model streamed as pieces is never
    whole in memory, and making and digesting overlap writing."""
    folder = check_destination(out)
    fd, tmp = _mkstemp(out, folder)
    try:
        os.fchmod(fd, _final_mode(out))  # mkstemp makes 0600 files; a saved model is a normal file
        try:
            _write_items(fd, wire.digested(wire.items(pieces)))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, out)
        _fsync_folder(folder)
    except BaseException as exc:  # KeyboardInterrupt too: never leave the temporary file
        Path(tmp).unlink(missing_ok=True)
        _reraise_os_error(exc, out)
        raise


def _write_items(fd: int, stream: Iterable[wire.Item]) -> None:
    sink = _FileSink(fd)
    writer = wire.Writer(sink.write, sink.patch)
    for batch in produced_ahead(_batches(stream), AHEAD_BATCHES):
        for item in batch:
            writer.take(item)
    sink.flush()
    writer.finish()


def _batches(stream: Iterable[wire.Item]) -> Iterator[list[wire.Item]]:
    """The items in lists of up to :data:`BATCH_ITEMS`, a large buffer closing its list: the
    hand-over between the threads costs tens of microseconds, which a model of many small
    nodes would otherwise pay per node."""
    batch: list[wire.Item] = []
    for item in stream:
        batch.append(item)
        large = isinstance(item, (bytes, memoryview)) and len(item) >= GATHER_BYTES
        if large or len(batch) >= BATCH_ITEMS:
            yield batch
            batch = []
    if batch:
        yield batch


class _FileSink:
    """Writes to a file descriptor: small buffers gathered into one ``write``, large ones
    written in slices, each slice's pages handed to the disk once written (flush-behind: the
    kernel would otherwise hold them until the final fsync, which then waits for all of them)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.pending, self.written, self.flushed = fd, bytearray(), 0, 0

    def write(self, buf: bytes | memoryview) -> None:
        view = memoryview(buf).cast("B")
        if len(view) < GATHER_BYTES:
            self.pending += view
            if len(self.pending) >= GATHER_BYTES:
                self.flush()
            return
        self.flush()
        for start in range(0, len(view), SLICE_BYTES):
            self._write_through(view[start : start + SLICE_BYTES])

    def flush(self) -> None:
        if self.pending:
            self._write_through(memoryview(self.pending))
            self.pending = bytearray()

    def patch(self, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset`` (after :meth:`flush`; the file position stays)."""
        if hasattr(os, "pwrite"):
            _write_fully(lambda view: os.pwrite(self.fd, view, offset + len(data) - len(view)), memoryview(data))
            return
        end = os.lseek(self.fd, 0, os.SEEK_CUR)
        os.lseek(self.fd, offset, os.SEEK_SET)
        _write_fully(lambda view: os.write(self.fd, view), memoryview(data))
        os.lseek(self.fd, end, os.SEEK_SET)

    def _write_through(self, view: memoryview) -> None:
        _write_fully(lambda rest: os.write(self.fd, rest), view)
        self.written += len(view)
        if self.written - self.flushed >= SLICE_BYTES and hasattr(os, "posix_fadvise"):
            # Linux starts writing dirty pages back on DONTNEED (and drops none of them).
            os.posix_fadvise(self.fd, self.flushed, self.written - self.flushed, os.POSIX_FADV_DONTNEED)
            self.flushed = self.written


def _write_fully(write, view: memoryview) -> None:
    """``write`` (which may write less than it is given) until ``view`` is written."""
    while len(view):
        view = view[write(view):]


def produced_ahead(source: Iterable[T], depth: int) -> Iterator[T]:
    """``source``'s items, made by a thread that runs up to ``depth`` items ahead of the
    caller. An exception in the thread is raised here; when the caller stops early the thread
    stops at its next item."""
    box: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    thread = threading.Thread(target=_produce, args=(source, box, stop), name="onnxmlu-pieces", daemon=True)
    thread.start()
    try:
        while (item := box.get()) is not _DONE:
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join()


def _produce(source: Iterable, box: queue.Queue, stop: threading.Event) -> None:
    try:
        for item in source:
            if not _put(box, item, stop):
                return
        _put(box, _DONE, stop)
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
        _put(box, _Failed(exc), stop)


def _put(box: queue.Queue, item, stop: threading.Event) -> bool:
    """Put ``item`` unless the consumer stopped; whether it was put."""
    while not stop.is_set():
        try:
            box.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


_DONE = object()


@dataclass
class _Failed:
    error: BaseException


def write_model_atomic(model: onnx.ModelProto, out: Path, *, external_data: bool | None = None) -> Path:
    """Save ``model`` at ``out`` atomically; ``external_data`` None means "when over 2 GB"."""
    if external_data is None:
        external_data = needs_external_data(model)
    if not external_data:
        write_bytes_atomic(_serialize(model, out), out)
        return out
    _write_with_external_data(model, out)
    return out


def _serialize(model: onnx.ModelProto, out: Path) -> bytes:
    try:
        return model.SerializeToString()
    except Exception as exc:  # noqa: BLE001 - protobuf's EncodeError above 2 GB
        raise OnnxMluError(f"cannot serialize the model for {out} ({exc}); save it with external data") from None


def _write_with_external_data(model: onnx.ModelProto, out: Path) -> None:
    folder = check_destination(out)
    data_name = external_data_name(out)
    staging = Path(_mkdtemp(out, folder))
    try:
        staged_model, staged_data = staging / out.name, staging / data_name
        # onnx.save strips the weights from the proto it writes: write a copy, keep the caller's.
        copy = copy_model(model)
        onnx.save(copy, staged_model, save_as_external_data=True, all_tensors_to_one_file=True,
                  location=data_name, size_threshold=1024, convert_attribute=True)
        del copy
        for path, final in ((staged_data, folder / data_name), (staged_model, out)):
            if path.exists():  # a model without a tensor above the threshold has no data file
                os.chmod(path, _final_mode(final))
                _fsync_file(path)
        _commit(staging, staged_model, staged_data, out, folder / data_name)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        _reraise_os_error(exc, out)
        raise
    shutil.rmtree(staging, ignore_errors=True)


def publish_staged(staging: Path, out: Path) -> None:
    """Move the model the writers above saved as ``staging / out.name`` (with its external
    data, when it has some) into ``out``'s place, in :func:`_commit`'s order: what ``fuse
    --check`` does once the check passed, so an unverified model is never published."""
    data = external_data_name(out)
    _commit(staging, staging / out.name, staging / data, out, out.parent / data)


def _commit(staging: Path, staged_model: Path, staged_data: Path, out: Path, data: Path) -> None:
    """Old model and data out of the way (into the staging folder), new data in, new model in
    (the commit point). An exception or interrupt rolls back to the old pair."""
    folder = out.parent
    backups = {out: staging / ".previous-model", data: staging / ".previous-data"}
    moved: list[Path] = []
    placed_data = False
    try:
        for path in (out, data):  # the model first: an old model never meets new data
            if path.exists():
                os.replace(path, backups[path])
                moved.append(path)
        _fsync_folder(folder)
        if staged_data.exists():
            os.replace(staged_data, data)
            placed_data = True
            _fsync_folder(folder)
        os.replace(staged_model, out)
    except BaseException:  # not committed: put the old pair back (data first, the model last)
        if placed_data and data not in moved:
            data.unlink(missing_ok=True)
        for path in reversed(moved):
            os.replace(backups[path], path)
        raise
    _fsync_folder(folder)


def _mkstemp(out: Path, folder: Path) -> tuple[int, str]:
    try:
        return tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OnnxMluError(f"cannot write {out}: {exc.strerror or exc}") from None


def _mkdtemp(out: Path, folder: Path) -> str:
    try:
        return tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise OnnxMluError(f"cannot write {out}: {exc.strerror or exc}") from None


def _final_mode(path: Path) -> int:
    """An existing file keeps its permissions; a new one gets what open() would give it."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    try:  # Linux reports it without changing it (os.umask would race with other threads)
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    """Make a rename durable; some filesystems refuse to fsync a directory, which is harmless."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _reraise_os_error(exc: BaseException, out: Path) -> None:
    """Disk full, permission denied, ...: one clear line instead of an OSError traceback."""
    if isinstance(exc, OSError):
        raise OnnxMluError(f"cannot write {out}: {exc.strerror or exc}") from None
