"""Pickle files (torch ``.pt``, ``.pkl``) of unknown origin: read in a worker process, never here.

A pickle is a program: loading one may call any function it names (``os.system`` ...). slime saves
its rollouts so (``torch.save({"rollout_id": N, "samples": [sample.to_dict(), ...]})``), and so do
other trainers. This module reads such a file without ever unpickling it in the app's process:

1. **Where**: a worker of a :class:`backend.runtime.worker_pool.WorkerPool` (``spawn``ed, under a memory cap
   of ``ALI_PICKLE_MEMORY_BYTES``, default 2 GiB; ``ALI_PICKLE_TIMEOUT_S`` seconds a file, default
   120; ``ALI_PICKLE_WORKERS`` workers, default 1), as :mod:`backend.trace.parquet_guard` decodes Parquet.
2. **The allow-list, before anything is loaded**: the pickle's opcodes are listed with
   :func:`pickletools.genops` (which reads, never runs) and every global it names must be in
   :data:`ALLOWED_GLOBALS`: torch's tensor rebuild function, its typed storages and
   ``collections.OrderedDict`` (what ``torch.save`` of tensors in plain containers names); in a bare
   pickle that names one of SkyRL's batch classes (``trainer.dump_data_batch``), also those classes,
   ``torch.storage._load_from_bytes`` and ``torch.device`` (:data:`SKYRL_GLOBALS`). Anything else
   (``os.system``, ``builtins.eval``, any other class of a trainer's own) refuses the file, naming the
   global; a global that cannot be read off the opcodes refuses it too. Nothing was run.
3. **The restricted unpickler**: a torch zip file is then loaded by ``torch.load(...,
   weights_only=True)`` (torch's own restricted unpickler, which admits tensors and plain containers
   only), a bare pickle by :class:`_PlainUnpickler` (``find_class`` admits ``OrderedDict`` alone, no
   persistent ids; for a SkyRL batch, :class:`_SkyrlUnpickler` maps SkyRL's names to the inert
   stand-ins of :mod:`backend.safety.pickle_standins`, which keep the batch's pickled state as data and
   never call torch or SkyRL). Either refuses what slipped past 2.
4. **What comes back**: tensors become lists (``tolist``), dict keys must be text, values plain
   (dict, list, tuple, text, numbers, booleans, None); the worker sends that as JSON, which this
   process parses: no pickle crosses back either.

What it costs (2 shared cores at load 8): the first file waits ~7 s for the worker (Python, torch);
then slime's fixture reads in 16 ms, and a dump of 256 samples × 4,000 ids held as Python lists
(8.7 MB) in 13.7 s: both passes are pure Python (``genops`` 3.7 s, torch's ``weights_only``
unpickler 7.6 s, where the unrestricted one takes 0.5 s), hence the time limit's default.

``read_pickle`` is for the operator's files and for uploads in local mode; a public server refuses
pickles before they reach it (:meth:`backend.safety.trust.TrustPolicy.check_pickle`). Legacy (pre-1.6,
non-zip) torch files are refused with a hint to re-save them.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import pickletools
import zipfile
from typing import Any

from backend.runtime.worker_pool import OVER_MEMORY_EXIT, Lost, Overrun, WorkerPool, send_raw
from backend.safety import pickle_standins as standins

MEMORY_BYTES = int(os.environ.get("ALI_PICKLE_MEMORY_BYTES", str(2 << 30)))
TIMEOUT_S = float(os.environ.get("ALI_PICKLE_TIMEOUT_S", "120"))
WORKERS = max(1, int(os.environ.get("ALI_PICKLE_WORKERS", "1")))
START_TIMEOUT_S = float(os.environ.get("ALI_PICKLE_START_TIMEOUT_S", "60"))
QUEUE_TIMEOUT_S = float(os.environ.get("ALI_PICKLE_QUEUE_TIMEOUT_S", "30"))
MAX_DEPTH = 64  # nesting of containers in what comes back

_STORAGES = ("Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool")
ALLOWED_GLOBALS = frozenset({
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_tensor"),
    ("collections", "OrderedDict"),
    *(("torch", f"{s}Storage") for s in _STORAGES),
})
_TORCH_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}


class PickleRefused(ValueError):
    """The file is not read: what it asks for, or why it cannot be read, is in the message."""


class PickleWorkerError(RuntimeError):
    """No pickle worker could be had (none started, all busy, shut down)."""


def looks_like_pickle(path: str) -> bool:
    """Whether ``path`` holds a pickle: a zip with a ``data.pkl`` (torch's format; a zip too damaged
    to list counts too, so that it is reported as a damaged torch file) or bytes that start as a
    pickle of protocol 2-5 do. Reads the first bytes and, for a zip, its listing."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return True
    if head == b"PK\x03\x04":
        try:
            with zipfile.ZipFile(path) as z:
                return any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist())
        except (zipfile.BadZipFile, OSError):
            return True  # a damaged zip: torch's format cut short (the pickle reader says it is not readable)
    return False


# ---- in the worker ----------------------------------------------------------------------------------


def globals_of(data: bytes) -> list[tuple[str, str]]:
    """The globals a pickle names, read off its opcodes (nothing is run). A ``STACK_GLOBAL`` whose
    module and name are not the two strings pushed just before it is refused."""
    found: list[tuple[str, str]] = []
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL":
                mod, _, name = str(arg).partition(" ")
                found.append((mod, name))
            elif op.name == "STACK_GLOBAL":
                if len(strings) < 2:
                    raise PickleRefused("the pickle names a global that cannot be read without running it")
                found.append((strings[-2], strings[-1]))
            elif op.name == "INST":
                mod, _, name = str(arg).partition(" ")
                found.append((mod, name))
            if op.name in _STRING_OPS:
                strings.append(arg if isinstance(arg, str) else repr(arg))
            elif op.name not in ("MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"):
                strings = []  # only strings pushed right before a STACK_GLOBAL name it
    except PickleRefused:
        raise
    except Exception as e:  # noqa: BLE001 - truncated or damaged opcodes
        raise PickleRefused(f"not a readable pickle ({type(e).__name__}: {str(e)[:200]})") from None
    return found


def check_globals(data: bytes, allowed: frozenset[tuple[str, str]] = ALLOWED_GLOBALS) -> None:
    """Refuse a pickle that names any global outside ``allowed`` (:data:`ALLOWED_GLOBALS`)."""
    _refuse_unlisted(globals_of(data), allowed)


def _refuse_unlisted(found: list[tuple[str, str]], allowed: frozenset[tuple[str, str]]) -> None:
    bad = sorted({f"{m}.{n}" for m, n in found if (m, n) not in allowed})
    if bad:
        raise PickleRefused(f"the pickle asks for {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''}, which is not "
                            "allowed (only tensors and plain containers are read); it was not loaded")


def is_skyrl_batch(found: list[tuple[str, str]]) -> bool:
    """Whether a pickle's globals name one of SkyRL's batch classes."""
    return any(m == standins.SKYRL_MODULE and n in standins.SKYRL_CLASSES for m, n in found)


class _PlainUnpickler(pickle.Unpickler):
    """A bare pickle: plain containers and ``OrderedDict`` only (and, in :class:`_SkyrlUnpickler`,
    the stand-ins of :mod:`backend.safety.pickle_standins`)."""

    standins: dict[tuple[str, str], Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            import collections

            return collections.OrderedDict
        if (module, name) in self.standins:
            return self.standins[(module, name)]
        raise PickleRefused(f"the pickle asks for {module}.{name}, which is not allowed; it was not loaded")

    def persistent_load(self, pid: Any) -> Any:
        raise PickleRefused("the pickle refers to outside storage (a persistent id), which is not allowed")


class _SkyrlUnpickler(_PlainUnpickler):
    """A SkyRL batch pickle (``TensorBatch.save``): its classes and tensor helpers as stand-ins."""

    standins = {**standins.classes(), **standins.helpers()}


SKYRL_GLOBALS = frozenset({*ALLOWED_GLOBALS, *_SkyrlUnpickler.standins})


def _plain(v: Any, depth: int = 0) -> Any:
    """What came out of the pickle as JSON-able values: tensors as lists, tuples as lists."""
    if depth > MAX_DEPTH:
        raise PickleRefused(f"containers nested more than {MAX_DEPTH} deep")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, standins.SkyrlBatch):
        return _plain(v.plain(_torch_bytes), depth + 1)
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise PickleRefused(f"a dict key is {type(k).__name__}, not text")
            out[k] = _plain(x, depth + 1)
        return out
    if isinstance(v, (list, tuple)):
        return [_plain(x, depth + 1) for x in v]
    if type(v).__module__ == "torch" and type(v).__name__ in ("Tensor", "Parameter"):
        return v.detach().cpu().tolist()
    raise PickleRefused(f"a value of type {type(v).__module__}.{type(v).__name__} is not plain data")


def _load_torch(src: Any) -> Any:
    """A torch zip file (a path, or its bytes in a file object): allow-listed globals, then
    torch's ``weights_only`` loader."""
    with zipfile.ZipFile(src) as z:
        names = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(names) != 1:
            raise PickleRefused("a zip file without exactly one data.pkl is not a torch file")
        check_globals(z.read(names[0]))
    import torch

    if not isinstance(src, str):
        src.seek(0)
    try:
        return torch.load(src, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise PickleRefused(f"torch's restricted loader refused it: {str(e).splitlines()[0][:300]}") from None


def _torch_bytes(data: bytes) -> Any:
    """A tensor saved with ``torch.save`` into bytes (inside a SkyRL batch), as plain data."""
    if data[:4] != b"PK\x03\x04":
        raise PickleRefused("a tensor inside the pickle is not in torch's zip format")
    return _plain(_load_torch(io.BytesIO(data)))


def _load(path: str) -> Any:
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"PK\x03\x04":
        return _load_torch(path)
    with open(path, "rb") as f:
        data = f.read()
    found = globals_of(data)
    skyrl = is_skyrl_batch(found)
    _refuse_unlisted(found, SKYRL_GLOBALS if skyrl else ALLOWED_GLOBALS)
    buf = io.BytesIO(data)
    obj = (_SkyrlUnpickler if skyrl else _PlainUnpickler)(buf).load()
    if isinstance(obj, int) and obj == _TORCH_LEGACY_MAGIC:
        raise PickleRefused("a legacy (pre-1.6) torch file: load and save it again with torch.save to read it here")
    return obj


def _setup() -> Any:  # in the worker, before it says ready
    import torch

    buf = io.BytesIO()
    torch.save({"t": torch.zeros(2)}, buf)  # warm-up: the first load's imports are not charged to a file
    buf.seek(0)
    torch.load(buf, weights_only=True)
    return _answer


def _answer(conn: Any, req: dict[str, Any]) -> None:
    try:
        st = os.stat(req["path"])
        if (st.st_size, st.st_mtime_ns) != tuple(req["stamp"]):
            raise PickleRefused("the file changed while it was read")
        body = json.dumps(_plain(_load(req["path"])), ensure_ascii=False).encode("utf-8")
    except MemoryError:
        conn.send(("memory",))
        return
    except (PickleRefused, standins.StateRefused) as e:
        conn.send(("refused", str(e)[:500]))
        return
    except Exception as e:  # noqa: BLE001 - damaged bytes: the reason goes back as text
        conn.send(("refused", f"not a readable pickle ({type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''})"))
        return
    if len(body) > req["max_bytes"]:
        conn.send(("refused", f"it holds {len(body):,} bytes of data once read; the limit is {req['max_bytes']:,}"))
        return
    conn.send(("json", len(body)))
    send_raw(conn, body)


class PicklePool(WorkerPool):
    def __init__(self, size: int = WORKERS, *, timeout_s: float = TIMEOUT_S, memory_bytes: int = MEMORY_BYTES) -> None:
        super().__init__(size, kind="pickle", noun="pickle worker", service="pickle reader", error=PickleWorkerError,
                         setup=_setup, timeout_s=timeout_s, start_timeout_s=START_TIMEOUT_S,
                         queue_timeout_s=QUEUE_TIMEOUT_S, memory_bytes=memory_bytes, lazy=True)


POOL = PicklePool()  # started by the first pickle read; closed at exit and at the app's shutdown


# ---- this process -----------------------------------------------------------------------------------


def read_pickle(path: str, *, max_bytes: int, pool: WorkerPool | None = None) -> Any:
    """The plain data (dicts, lists, text, numbers; tensors as lists) of the pickle at ``path``,
    read by a pickle worker (see the module's docstring). ``max_bytes``: the most bytes of JSON the
    data may take once read. Raises :class:`PickleRefused` with the reason."""
    pool = POOL if pool is None else pool
    path = os.path.abspath(path)
    st = os.stat(path)
    try:
        lease = pool.lease()
    except PickleWorkerError as e:
        raise PickleRefused(f"no pickle worker: {e}") from None
    with lease:  # a refusal is an answer: the worker goes back to the pool (it never ran the file's code)
        try:
            lease.send({"path": path, "stamp": (st.st_size, st.st_mtime_ns), "max_bytes": max_bytes})
            head = lease.recv()
            body = lease.recv_raw(head[1]) if head[0] == "json" else None
        except Overrun:
            raise PickleRefused(f"reading it took longer than the {pool.timeout_s:g} s limit of the pickle worker "
                                "(ALI_PICKLE_TIMEOUT_S); it was stopped") from None
        except Lost as e:
            if e.exitcode in (OVER_MEMORY_EXIT, -9):
                raise PickleRefused(f"reading it needs more than the {pool.memory_bytes >> 20:,} MiB memory limit of the "
                                    "pickle worker (ALI_PICKLE_MEMORY_BYTES)") from None
            raise PickleRefused(f"the pickle worker stopped while reading it ({e})") from None
        if head[0] == "memory":
            lease.kill()  # its heap is suspect: a fresh worker for the next file
    if body is not None:
        return json.loads(bytes(body))
    if head[0] == "memory":
        raise PickleRefused(f"reading it needs more than the {pool.memory_bytes >> 20:,} MiB memory limit of the "
                            "pickle worker (ALI_PICKLE_MEMORY_BYTES)")
    raise PickleRefused(head[1])
