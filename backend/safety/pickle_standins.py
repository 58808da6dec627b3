"""Stand-ins for the few trainer classes a pickle may name: plain data, never the trainer's code.

Used only by :mod:`backend.safety.pickle_guard`, in its worker, for a bare pickle that names one of
SkyRL's batch classes (``skyrl_train.training_batch.TensorBatch`` / ``TrainingInputBatch`` /
``TrainingOutputBatch``: what ``trainer.dump_data_batch`` pickles, ``TensorBatch.save``). Such a
pickle is a ``dict`` subclass rebuilt as ``NEWOBJ`` + ``SETITEMS`` (the batch's tensors, each
pickled by torch as ``_rebuild_tensor_v2`` over a storage that ``torch.storage._load_from_bytes``
would ``torch.load`` with no restriction) + ``BUILD`` (the state ``TensorBatch.__getstate__``
returns: ``batch_dict`` with every tensor again, as numpy bytes, ``shape`` and ``dtype``; or, for a
dtype numpy lacks such as bfloat16, and in skyrl-train 0.3.x for all, ``torch.save`` bytes;
``batch_size``, ``device``, ``metadata``).

Here the class is :class:`SkyrlBatch`, which takes only that state; the items' tensors are never
rebuilt (:func:`dropped` stands for both torch functions and returns a marker, the same tensors
being in the state), and ``torch.device`` becomes its text. Nothing named in the pickle is
imported or called. :meth:`SkyrlBatch.plain` decodes the state's bytes with an allow-list of
dtypes; ``torch.save`` bytes go back to the guard's own restricted reader (``load_torch``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

SKYRL_MODULE = "skyrl_train.training_batch"
SKYRL_CLASSES = ("TensorBatch", "TrainingInputBatch", "TrainingOutputBatch")
_DTYPES = {"bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8, "float16": 2, "float32": 4,
           "float64": 8}


class StateRefused(ValueError):
    """The pickled state is not SkyRL's batch state (the guard reports it as a refusal)."""


class _Dropped:
    """A tensor of the batch's items, not rebuilt (the state holds the same tensor)."""

    def __repr__(self) -> str:
        return "<tensor not rebuilt>"


DROPPED = _Dropped()


def dropped(*args: Any) -> _Dropped:
    """Stands for ``torch.storage._load_from_bytes`` and ``torch._utils._rebuild_tensor_v2``."""
    return DROPPED


def device(*args: Any) -> str:
    """Stands for ``torch.device``: its text (``cpu``, ``cuda:0``)."""
    if not all(isinstance(a, (str, int)) and not isinstance(a, bool) for a in args):
        raise StateRefused("torch.device with arguments that are not a device name")
    return ":".join(str(a) for a in args)


class SkyrlBatch(dict):
    """A SkyRL batch as its pickled state, nothing else."""

    kind = "TensorBatch"

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # only a REDUCE would call it: SkyRL's pickles never do
        raise StateRefused(f"the pickle builds a SkyRL {self.kind} by calling it, which SkyRL's own pickles never do")

    def __setitem__(self, key: Any, value: Any) -> None:
        if value is not DROPPED and value is not None:
            raise StateRefused(f"the SkyRL batch's item {key!r} is not a tensor")

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("batch_dict"), dict):
            raise StateRefused("the SkyRL batch's pickled state has no batch_dict")
        self.__dict__["_state"] = state

    def plain(self, load_torch: Callable[[bytes], Any]) -> dict[str, Any]:
        """``{"skyrl_batch", "batch_size", "device", "tensors": {name: nested lists | None},
        "metadata"}``; ``load_torch`` reads ``torch.save`` bytes (a tensor) as nested lists."""
        state = self.__dict__.get("_state")
        if state is None:
            raise StateRefused(f"the SkyRL {self.kind} has no pickled state")
        tensors = {}
        for k, v in state["batch_dict"].items():
            if not isinstance(k, str):
                raise StateRefused("a SkyRL batch key is not text")
            tensors[k] = _tensor(k, v, load_torch)
        return {"skyrl_batch": self.kind, "batch_size": state.get("batch_size"), "device": state.get("device"),
                "tensors": tensors, "metadata": state.get("metadata")}


def _tensor(key: str, v: Any, load_torch: Callable[[bytes], Any]) -> Any:
    if v is None:
        return None
    if isinstance(v, bytes):  # skyrl-train 0.3.x: torch.save bytes
        return load_torch(v)
    if not isinstance(v, dict) or not isinstance(v.get("data"), bytes):
        raise StateRefused(f"the SkyRL batch's {key!r} is not a serialised tensor")
    if v.get("format") == "torch":
        return load_torch(v["data"])
    dtype, shape, data = v.get("dtype"), v.get("shape"), v["data"]
    if dtype not in _DTYPES:
        raise StateRefused(f"the SkyRL batch's {key!r} has dtype {str(dtype)[:40]!r}, which is not read")
    if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                       for d in shape):
        raise StateRefused(f"the SkyRL batch's {key!r} has no valid shape")
    if math.prod(shape) * _DTYPES[dtype] != len(data):
        raise StateRefused(f"the SkyRL batch's {key!r} holds {len(data):,} bytes, not what shape {tuple(shape)} of "
                           f"{dtype} needs")
    import torch

    flat = torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype)) if data else torch.empty(0, dtype=getattr(torch, dtype))
    return flat.reshape(tuple(shape)).tolist()


def classes() -> dict[tuple[str, str], type[SkyrlBatch]]:
    """``(module, name)`` → stand-in class, one per SkyRL batch class."""
    return {(SKYRL_MODULE, n): type(n, (SkyrlBatch,), {"kind": n}) for n in SKYRL_CLASSES}


def helpers() -> dict[tuple[str, str], Any]:
    """The other globals a SkyRL batch pickle names, and what stands for each."""
    return {("torch.storage", "_load_from_bytes"): dropped, ("torch._utils", "_rebuild_tensor_v2"): dropped,
            ("torch", "device"): device}
