"""(helper, no tests) The real ``spaces`` package's CUDA emulation on this CPU machine, in a process
of its own: ``python tests/zerogpu_sim.py MODEL_DIR`` prints one JSON object.

``spaces`` (0.51.3) imported with ``SPACES_ZERO_GPU=true`` patches torch for the whole process
(``spaces/zero/torch/patching.py``: ``torch._C._cuda_init`` replaced by a function that raises)
and enters its CUDA-faking torch modes in the importing thread only ("TorchModes are
thread-local"). Here torch is the CPU build, so it is first dressed as a CUDA build at the few
points ``spaces`` and torch's lazy CUDA start read (``torch.version.cuda``, ``_cuda_init``,
``_cuda_getDeviceCount``, ``_cudart``, ``_is_in_bad_fork``); everything after that is the real
package's code. Nothing is scheduled (no GPU is ever lent), so the device API URL is never used.

Reported: ``plain_thread`` (a model moved to "cuda" in a thread of our own: the trap),
``generator`` (our transformers generator loaded lazily in a worker thread, as the first run does
when the start-up preload failed) and ``scorer`` (the lens's scorer loaded in a worker thread, as
``ui.logprob_lens.score`` does), each ``"ok <device>"`` or ``"<Error>: <message>"``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading


def dress_cpu_torch_as_cuda() -> None:
    import torch
    import torch._dynamo  # noqa: F401 - imported before the dressing: it probes the build on import
    import torch.cuda

    torch.version.cuda = "12.8"

    def no_cuda(*_a):
        raise AssertionError("no CUDA on this machine")

    def _is_in_bad_fork() -> bool:
        return False

    _is_in_bad_fork.__module__ = "torch.cuda"  # spaces sends it to a forked process by reference
    _is_in_bad_fork.__qualname__ = "_is_in_bad_fork"
    torch.cuda._is_in_bad_fork = _is_in_bad_fork
    torch._C._cuda_init = no_cuda
    torch._C._cuda_getDeviceCount = lambda: 1
    if torch.cuda._cudart is None:
        torch.cuda._cudart = object()


def outcome(fn) -> str:
    try:
        return f"ok {fn()}"
    except BaseException as e:  # noqa: BLE001 - reported
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def main(model: str) -> dict[str, str]:
    dress_cpu_torch_as_cuda()
    os.environ["SPACES_ZERO_GPU"] = "true"
    os.environ.setdefault("SPACES_ZERO_DEVICE_API_URL", "http://127.0.0.1:9")
    import spaces  # noqa: F401 - patches torch; its modes now hold in this thread only
    import torch

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from backend.generators.transformers_local import TransformersGenerator
    from ui import logprob_lens as L

    out: dict[str, str] = {}

    def plain():
        m = torch.nn.Linear(4, 4).to("cuda")
        return next(m.parameters()).device

    t = threading.Thread(target=lambda: out.__setitem__("plain_thread", outcome(plain)))
    t.start()
    t.join()

    def generator():
        gen = TransformersGenerator(model, device="cuda", dtype="float32", zerogpu=True)
        asyncio.run(gen.start())  # loads in the event loop's executor thread
        return next(gen.model.parameters()).device

    out["generator"] = outcome(generator)

    def scorer():
        s = asyncio.run(asyncio.to_thread(L.SCORERS.get, model, "float32", "cuda"))
        return next(s.model.parameters()).device

    out["scorer"] = outcome(scorer)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
