"""The sandbox child: runs user-typed tool code in a separate, limited interpreter.

Started by :mod:`backend.tools.sandbox` as ``python -I <this file> <request.json> <result fd>``.
It must stay **standard-library only**: nothing from ``backend`` (or transformers) is importable
here, and start-up must stay cheap.

Order of events:

1. read the request (mode, code, function, arguments) while still privileged;
2. compile the code (a syntax error is reported with its line);
3. apply the resource limits (address space, CPU seconds, file size, open files, processes,
   no core dumps) and, when running as root, switch to the ``nobody`` user;
4. run the user code in a fresh module, then either describe its public documented functions
   (``discover``: signature, docstring and type hints as JSON; the server rebuilds a stand-in
   function from that and runs transformers' ``get_json_schema`` on it) or call one of them;
5. write ``R`` (ready) to the result pipe before the user code runs, then exactly one JSON
   document. Whatever the function prints goes to
   stdout, which the parent captures separately.
"""

import json
import os
import sys


def _load_runtime():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_runtime.py")
    spec = importlib.util.spec_from_file_location("_ali_tool_runtime", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


MODULE_NAME = "__tool_source__"
_THIS_FILE = os.path.abspath(__file__)
MAX_MESSAGE = 4000
MAX_TRACEBACK = 20000


def _send(fd, obj):
    try:
        data = json.dumps(obj, ensure_ascii=True).encode("ascii")
    except (TypeError, ValueError, RecursionError) as e:  # pragma: no cover - obj is built here
        data = json.dumps({"status": "internal_error", "message": repr(e)}).encode("ascii")
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _vm_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _apply_limits(limits):
    """Resource limits first, then (as root) drop to nobody. Returns notes on what failed."""
    import resource

    notes = []

    def setlim(which, soft, hard=None):
        hard = soft if hard is None else hard
        try:
            cur_soft, cur_hard = resource.getrlimit(which)
            if cur_hard != resource.RLIM_INFINITY:
                hard = min(hard, cur_hard)
                soft = min(soft, hard)
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError) as e:
            notes.append(f"rlimit {which}: {e}")

    mem = limits.get("memory_bytes")
    if mem:
        # the limit is on top of what the interpreter already maps
        setlim(resource.RLIMIT_AS, _vm_bytes() + int(mem))
    cpu = limits.get("cpu_s")
    if cpu:
        cpu = max(1, int(-(-float(cpu) // 1)))
        setlim(resource.RLIMIT_CPU, cpu, cpu + 1)  # SIGXCPU at soft, SIGKILL at hard
    fsize = limits.get("file_size_bytes")
    if fsize is not None:
        setlim(resource.RLIMIT_FSIZE, int(fsize))
    nofile = limits.get("nofile")
    if nofile:
        setlim(resource.RLIMIT_NOFILE, int(nofile))
    setlim(resource.RLIMIT_CORE, 0)
    nproc = limits.get("nproc")
    if nproc is not None and hasattr(resource, "RLIMIT_NPROC"):
        setlim(resource.RLIMIT_NPROC, int(nproc))

    if limits.get("drop_privileges") and hasattr(os, "geteuid") and os.geteuid() == 0:
        uid = int(limits.get("uid", 65534))
        gid = int(limits.get("gid", 65534))
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        except OSError as e:
            notes.append(f"could not switch to uid {uid}: {e}")
    if limits.get("block_processes"):
        err = _block_process_creation()
        if err:
            notes.append(f"seccomp: {err}")
    return notes


# Linux seccomp-bpf: make fork/vfork/clone/clone3 fail with EPERM, so no process (or thread)
# can be created whatever the uid (RLIMIT_NPROC does not bind root). Syscalls of another ABI
# (i386 via int 0x80, x32) are refused outright.
_ARCHES = {
    # machine: (AUDIT_ARCH_*, blocked syscall numbers, refuse numbers >= this (x32) or None)
    "x86_64": (0xC000003E, (56, 57, 58, 435), 0x40000000),
    "aarch64": (0xC00000B7, (220, 435), None),
}


def _block_process_creation():
    """Install the filter; return None on success or why it could not be installed."""
    import ctypes
    import platform

    arch = _ARCHES.get(platform.machine())
    if sys.platform != "linux" or arch is None:
        return f"not supported on {sys.platform}/{platform.machine()}"
    audit_arch, blocked, x32 = arch
    LD_ABS, JEQ, JGE, RET = 0x20, 0x15, 0x35, 0x06
    ALLOW, DENY = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    n_checks = len(blocked) + (1 if x32 is not None else 0)
    prog = [(LD_ABS, 0, 0, 4)]  # seccomp_data.arch
    deny_at = 3 + n_checks + 1  # index of the final RET DENY
    prog.append((JEQ, 0, deny_at - 1 - 1, audit_arch))
    prog.append((LD_ABS, 0, 0, 0))  # seccomp_data.nr
    if x32 is not None:
        prog.append((JGE, deny_at - len(prog) - 1, 0, x32))
    for nr in blocked:
        prog.append((JEQ, deny_at - len(prog) - 1, 0, nr))
    prog.append((RET, 0, 0, ALLOW))
    prog.append((RET, 0, 0, DENY))
    assert len(prog) == deny_at + 1

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    filters = (SockFilter * len(prog))(*[SockFilter(*ins) for ins in prog])
    fprog = SockFprog(len(prog), filters)
    libc = ctypes.CDLL(None, use_errno=True)
    ul = ctypes.c_ulong
    if libc.prctl(38, ul(1), ul(0), ul(0), ul(0)) != 0:  # PR_SET_NO_NEW_PRIVS
        return f"PR_SET_NO_NEW_PRIVS failed (errno {ctypes.get_errno()})"
    if libc.prctl(22, ul(2), ctypes.cast(ctypes.pointer(fprog), ctypes.c_void_p), ul(0), ul(0)) != 0:  # PR_SET_SECCOMP, FILTER
        return f"PR_SET_SECCOMP failed (errno {ctypes.get_errno()})"
    return None


def _error_payload(status, exc, limits):
    etype = type(exc).__name__
    try:
        msg = str(exc)
    except BaseException:  # noqa: BLE001 - a hostile __str__
        msg = "<unprintable exception>"
    if len(msg) > MAX_MESSAGE:
        msg = msg[:MAX_MESSAGE] + "...(truncated)"
    if isinstance(exc, MemoryError):
        mem = limits.get("memory_bytes")
        tb = "MemoryError" + (f" (the sandbox allows {mem // (1 << 20)} MB)" if mem else "")
        try:
            import traceback

            traceback.clear_frames(exc.__traceback__)
        except BaseException:  # noqa: BLE001
            pass
    else:
        try:
            import traceback

            frames = exc.__traceback__
            while frames is not None and frames.tb_frame.f_code.co_filename == _THIS_FILE:
                frames = frames.tb_next  # the child's own frames say nothing about the tool
            tb = "".join(traceback.format_exception(type(exc), exc, frames))
        except BaseException:  # noqa: BLE001
            tb = f"{etype}: {msg}"
        if len(tb) > MAX_TRACEBACK:
            tb = "...(truncated)...\n" + tb[-MAX_TRACEBACK:]
    out = {"status": status, "type": etype, "message": msg, "traceback": tb, "line": _user_line(exc, limits.get("_filename"))}
    if isinstance(exc, SystemExit):
        out["exit_code"] = exc.code if isinstance(exc.code, (int, type(None))) else str(exc.code)
    return out


def _user_line(exc, filename):
    """The last line of the user's code in the traceback (None if it is not there)."""
    if isinstance(exc, SyntaxError) and exc.filename == filename:
        return exc.lineno
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _compile(code, filename):
    try:
        return compile(code, filename, "exec"), None
    except SyntaxError as e:
        return None, {
            "status": "syntax_error",
            "message": str(e.msg),
            "lineno": e.lineno,
            "offset": e.offset,
            "text": (e.text or "").rstrip("\n")[:500],
        }
    except (ValueError, RecursionError, MemoryError, OverflowError) as e:
        return None, {"status": "syntax_error", "message": f"{type(e).__name__}: {e}", "lineno": None}


def _exec_module(code_obj, filename):
    import types

    mod = types.ModuleType(MODULE_NAME)
    mod.__file__ = filename
    sys.modules[MODULE_NAME] = mod
    exec(code_obj, mod.__dict__)  # noqa: S102 - this is the sandbox
    return mod


def _public_functions(mod):
    import inspect

    out = []
    for name, obj in list(vars(mod).items()):
        if name.startswith("_") or not inspect.isfunction(obj):
            continue
        if getattr(obj, "__module__", None) != MODULE_NAME or obj.__name__ != name:
            continue
        out.append((name, obj))
    return out


def _encode_hint(h):
    """A resolved type hint as JSON, for the server to rebuild an equivalent one (see
    backend.tools.schema_stub). Mirrors what transformers' get_json_schema looks at."""
    import types
    import typing

    if h is type(None) or h is None:
        return {"t": "none"}
    if h is typing.Any:
        return {"t": "any"}
    if h in (int, float, str, bool, list, tuple, dict):
        return {"t": "builtin", "name": h.__name__}
    origin, args = typing.get_origin(h), typing.get_args(h)
    if origin is None:
        if isinstance(h, type):
            return {"t": "class", "name": f"{h.__module__}.{h.__qualname__}"}
        return {"t": "class", "name": repr(h)[:200]}
    if origin is typing.Union or origin is getattr(types, "UnionType", None):
        return {"t": "union", "args": [_encode_hint(a) for a in args]}
    if origin is typing.Literal:
        vals = []
        for v in args:
            if type(v) in (int, float, str, bool, type(None)):
                vals.append({"ty": type(v).__name__, "v": v})
            else:
                vals.append({"ty": "other"})
        return {"t": "literal", "values": vals}
    if origin in (list, tuple, dict):
        return {"t": "generic", "origin": origin.__name__,
                "args": [{"t": "ellipsis"} if a is Ellipsis else _encode_hint(a) for a in args]}
    return {"t": "unsupported", "repr": repr(h).replace("typing.", "")[:200]}


def _describe(fn):
    """What get_json_schema needs from a function, as JSON: name, docstring, parameters
    (kind, has a default, has an annotation) and the resolved type hints."""
    import inspect
    import typing

    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    params = [{"name": p.name, "kind": p.kind.name, "default": p.default is not p.empty,
               "annotated": p.annotation is not p.empty} for p in sig.parameters.values()]
    return {"name": fn.__name__, "doc": fn.__doc__, "params": params,
            "hints": {k: _encode_hint(v) for k, v in hints.items()}, "line": fn.__code__.co_firstlineno}


def _discover(req, fd, limits, code_obj):
    filename = req.get("filename") or "<tools>"
    try:
        mod = _exec_module(code_obj, filename)
    except BaseException as e:  # noqa: BLE001
        _send(fd, _error_payload("load_error", e, limits))
        return
    functions, skipped, errors = [], [], []
    for name, fn in _public_functions(mod):
        if not (fn.__doc__ or "").strip():
            skipped.append({"name": name, "reason": "no docstring"})
            continue
        try:
            d = _describe(fn)
            json.dumps(d)
        except BaseException as e:  # noqa: BLE001 - e.g. a string annotation that does not resolve
            errors.append({"name": name, "line": getattr(fn.__code__, "co_firstlineno", None),
                           "message": f"{type(e).__name__}: {e}"[:1000]})
            continue
        functions.append(d)
    _send(fd, {"status": "ok", "functions": functions, "skipped": skipped, "errors": errors})


def _call(req, fd, limits, runtime):
    filename = req.get("filename") or "<tools>"
    code_obj, err = _compile(req["code"], filename)
    if err:
        _send(fd, err)
        return
    try:
        mod = _exec_module(code_obj, filename)
    except BaseException as e:  # noqa: BLE001
        _send(fd, _error_payload("load_error", e, limits))
        return
    name = req["function"]
    fn = dict(_public_functions(mod)).get(name)
    if fn is None:
        _send(fd, {"status": "no_function", "message": f"the code no longer defines a function {name!r}"})
        return
    try:
        import inspect

        result = fn(**req.get("arguments", {}))
        if inspect.isawaitable(result):
            import asyncio

            async def _await(aw):
                return await aw

            result = asyncio.run(_await(result))
    except BaseException as e:  # noqa: BLE001 - SystemExit, KeyboardInterrupt: all are results here
        _send(fd, _error_payload("exception", e, limits))
        return
    try:
        text, note = runtime.to_content(result)
    except BaseException as e:  # noqa: BLE001
        payload = _error_payload("bad_result", e, limits)
        _send(fd, payload)
        return
    original = len(text)
    text, truncated = runtime.truncate_tool_response(text, req.get("max_response_length"), req.get("truncate_side") or "middle")
    _send(fd, {"status": "ok", "content": text, "note": note, "truncated": truncated,
               "original_length": original if truncated else None})


def main():
    req_path, fd = sys.argv[1], int(sys.argv[2])
    with open(req_path, encoding="utf-8") as f:
        req = json.load(f)
    limits = req.get("limits") or {}
    limits["_filename"] = req.get("filename") or "<tools>"
    try:
        sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")
        sys.stderr.reconfigure(encoding="utf-8", errors="backslashreplace")
    except (AttributeError, ValueError):
        pass
    # everything the child itself needs is imported before the limits and the switch to nobody
    import inspect  # noqa: F401
    import traceback  # noqa: F401
    import types  # noqa: F401

    runtime = _load_runtime()
    code_obj = None
    if req["mode"] == "discover":
        code_obj, err = _compile(req["code"], req.get("filename") or "<tools>")
        if err:
            _send(fd, err)
            return
    notes = _apply_limits(limits)
    if notes:
        sys.stderr.write("sandbox: " + "; ".join(notes) + "\n")
    os.write(fd, b"R")  # ready: the tool's own time starts now (start-up is not charged to it)
    if req["mode"] == "discover":
        _discover(req, fd, limits, code_obj)
    else:
        _call(req, fd, limits, runtime)


if __name__ == "__main__":
    main()
