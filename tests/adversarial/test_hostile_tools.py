"""Hostile tools: whatever a tool does, the registry returns an error result and this process
lives on. In-process tools (trusted code) and sandboxed user code (one subprocess per call)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time

import pytest

from backend.tools import SandboxedTool, SandboxLimits, ToolRegistry
from backend.tools.sandbox import can_drop_privileges
from backend.trace import ToolCall


def call(tool_name: str, **arguments) -> ToolCall:
    return ToolCall(name=tool_name, arguments=arguments, id="c1")


# ---- in-process --------------------------------------------------------------------------------


class Unprintable:
    def __str__(self):
        raise ValueError("no str for you")


class SlowStr:
    def __str__(self):
        time.sleep(30)
        return "late"


def raises() -> str:
    """Raises."""
    raise ZeroDivisionError("division by zero, on purpose")


def hangs() -> str:
    """Hangs."""
    time.sleep(30)
    return "never"


def not_json() -> object:
    """A result json cannot encode."""
    return {"when": time, "items": {1, 2}}


def unprintable() -> object:
    """A result with a raising __str__."""
    return Unprintable()


def slow_str() -> object:
    """A result whose __str__ hangs."""
    return SlowStr()


def ten_mb() -> str:
    """10 MB of text."""
    return "x" * 10_000_000


def chatty() -> str:
    """Prints a lot."""
    for i in range(20_000):
        print("line", i)
    return "done"


def exits() -> str:
    """Calls sys.exit."""
    sys.exit("bye")


def lone_surrogate() -> str:
    """Returns text that cannot be encoded as UTF-8."""
    return "bad \ud800 text"


# set by the test once it has seen the timeout: the stubborn tool then ends, instead of holding
# the session's event loop open at its close (the last test of a worker waited for it)
RELEASE_STUBBORN = threading.Event()


async def async_hangs_blocking_cancel() -> str:
    """Ignores cancellation (for 20 s: one that never gives up would also hang the event loop's
    shutdown, which no library can prevent)."""
    end = time.monotonic() + 20
    while time.monotonic() < end and not RELEASE_STUBBORN.is_set():
        try:
            await asyncio.sleep(0.5)
        except asyncio.CancelledError:
            continue
    return "finally"


IN_PROCESS = ToolRegistry.from_functions(
    [raises, hangs, not_json, unprintable, slow_str, ten_mb, chatty, exits, lone_surrogate, async_hangs_blocking_cancel]
)


async def test_in_process_raise():
    r = await IN_PROCESS.execute(call("raises"))
    assert (r.ok, r.error) == (False, "exception") and "ZeroDivisionError: division by zero, on purpose" in r.content


async def test_in_process_hang_is_cut_at_the_timeout():
    t0 = time.perf_counter()
    r = await IN_PROCESS.execute(call("hangs"), timeout_s=0.5)
    # did not wait for the 30 s sleep (bound far from both the timeout and the hang)
    assert r.error == "timeout" and time.perf_counter() - t0 < 15
    t0 = time.perf_counter()
    RELEASE_STUBBORN.clear()
    try:
        r = await IN_PROCESS.execute(call("async_hangs_blocking_cancel"), timeout_s=0.3)
        assert r.error == "timeout" and time.perf_counter() - t0 < 10  # the tool holds on for 20 s
    finally:
        RELEASE_STUBBORN.set()


async def test_in_process_results_that_are_not_json():
    r = await IN_PROCESS.execute(call("not_json"))
    assert r.ok and r.content.startswith("{'when': <module 'time'") and "not JSON-serialisable" in r.note
    r = await IN_PROCESS.execute(call("unprintable"))
    assert (r.ok, r.error) == (False, "bad_result") and "no str for you" in r.content
    t0 = time.perf_counter()
    r = await IN_PROCESS.execute(call("slow_str"), timeout_s=0.5)  # conversion runs under the same deadline
    assert r.error == "timeout" and time.perf_counter() - t0 < 15
    r = await IN_PROCESS.execute(call("lone_surrogate"))
    assert r.ok and r.content == "bad \ufffd text" and "surrogate" in r.note
    r.content.encode("utf-8")


async def test_in_process_ten_megabytes():
    r = await IN_PROCESS.execute(call("ten_mb"), max_response_length=100, truncate_side="middle")
    assert r.ok and r.truncated and r.original_length == 10_000_000
    assert r.content == "x" * 50 + "...(truncated)..." + "x" * 50


async def test_in_process_stdout_is_bounded():
    r = await IN_PROCESS.execute(call("chatty"))
    assert r.ok and r.content == "done"
    assert r.stdout.startswith("line 0\nline 1\n") and len(r.stdout) < 70_000 and "more characters not kept" in r.stdout


async def test_in_process_sys_exit():
    r = await IN_PROCESS.execute(call("exits"))
    assert r.error == "exception" and r.content == "Error: tool 'exits' called sys.exit(bye)"


# ---- sandboxed -----------------------------------------------------------------------------------

HOSTILE = r'''
import os
import sys
import time


def raises(x: int) -> int:
    """Raises.

    Args:
        x: divisor
    """
    return 1 // x


def hangs() -> str:
    """Sleeps forever."""
    time.sleep(1000)
    return "never"


def spins() -> str:
    """Burns CPU forever."""
    while True:
        pass


def not_json() -> object:
    """A set is not JSON."""
    return {1, 2, 3}


def ten_mb() -> str:
    """10 MB of text."""
    return "x" * 10_000_000


def prints() -> str:
    """Prints, a lot."""
    print("hello from the sandbox")
    sys.stdout.write("y" * 1_000_000)
    return "done"


def exits() -> str:
    """sys.exit."""
    sys.exit(3)


def hard_exit() -> str:
    """os._exit: no cleanup, no result."""
    os._exit(0)


def segfault() -> str:
    """A real segmentation fault."""
    import faulthandler
    faulthandler._sigsegv()
    return "unreachable"


def eats_memory() -> int:
    """Allocates until something gives."""
    hoard = []
    while True:
        hoard.append(bytearray(16 * 1024 * 1024))


def environment() -> dict:
    """What the code can see of its surroundings."""
    return {"env": dict(os.environ), "cwd": os.getcwd(), "files": os.listdir("."), "stdin": sys.stdin.read()}


def can_fork() -> str:
    """Tries to fork once."""
    try:
        pid = os.fork()
    except OSError as e:
        return "blocked: " + str(e)
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return "forked"


def fork_bomb() -> str:
    """The classic."""
    while True:
        os.fork()


def big_file() -> str:
    """Writes 5 MB to disk."""
    with open("big.bin", "wb") as f:
        f.write(b"z" * (5 * 1024 * 1024))
    return "written"


def whoami() -> dict:
    """Which user the code runs as, and whether it can read root's home."""
    try:
        os.listdir("/root")
        root_home = "readable"
    except OSError as e:
        root_home = type(e).__name__
    return {"uid": os.getuid(), "gid": os.getgid(), "root_home": root_home}


async def async_tool(n: int) -> list:
    """Async works too.

    Args:
        n: how many
    """
    return list(range(n))
'''


@pytest.fixture(scope="module")
def sandboxed() -> ToolRegistry:
    return ToolRegistry.from_python_source(HOSTILE, sandboxed=True)


def with_limits(reg: ToolRegistry, name: str, **limits) -> ToolRegistry:
    t = reg.get(name)
    return ToolRegistry([SandboxedTool(t.schema, t.code, t.function, SandboxLimits(**limits))])


async def test_sandbox_discovers_all_functions(sandboxed):
    assert sandboxed.names == ["raises", "hangs", "spins", "not_json", "ten_mb", "prints", "exits", "hard_exit", "segfault",
                               "eats_memory", "environment", "can_fork", "fork_bomb", "big_file", "whoami", "async_tool"]
    r = await sandboxed.execute(call("async_tool", n=3))
    assert r.ok and r.content == "[0, 1, 2]"


async def test_sandbox_raise(sandboxed):
    r = await sandboxed.execute(call("raises", x=0))
    assert (r.ok, r.error) == (False, "exception")
    assert r.content == "Error: tool 'raises' raised ZeroDivisionError: integer division or modulo by zero"
    assert 'File "<tools>", line 13, in raises' in r.error_detail and "_sandbox_child" not in r.error_detail


async def test_sandbox_hang_is_killed_at_the_timeout(sandboxed):
    t0 = time.perf_counter()
    r = await sandboxed.execute(call("hangs"), timeout_s=1)
    assert r.error == "timeout" and "killed" in r.error_detail
    assert time.perf_counter() - t0 < 60  # the tool sleeps 1000 s: it was killed, not waited for


async def test_sandbox_infinite_cpu_loop(sandboxed):
    t0 = time.perf_counter()
    r = await sandboxed.execute(call("spins"), timeout_s=1)
    assert r.error == "timeout" and time.perf_counter() - t0 < 60  # the loop never ends by itself
    # the CPU limit ends it too, without the wall clock
    r = await with_limits(sandboxed, "spins", cpu_s=1).execute(call("spins"), timeout_s=30)
    assert (r.ok, r.error) == (False, "crashed") and "CPU time limit (1 s)" in r.content


async def test_sandbox_non_json_result(sandboxed):
    r = await sandboxed.execute(call("not_json"))
    assert r.ok and r.content == "{1, 2, 3}" and "not JSON-serialisable" in r.note


async def test_sandbox_ten_megabytes(sandboxed):
    r = await sandboxed.execute(call("ten_mb"), max_response_length=100, truncate_side="right")
    assert r.ok and r.truncated and r.original_length == 10_000_000
    assert r.content == "(truncated)..." + "x" * 100
    r = await sandboxed.execute(call("ten_mb"))  # no truncation asked: over the 8 MiB result limit
    assert (r.ok, r.error) == (False, "bad_result") and "larger than the 8388608 byte limit" in r.content


async def test_sandbox_stdout_is_captured_and_bounded(sandboxed):
    r = await sandboxed.execute(call("prints"))
    assert r.ok and r.content == "done"  # the return value does not travel over stdout
    assert r.stdout.startswith("hello from the sandbox\nyyy") and "more bytes not kept" in r.stdout
    assert len(r.stdout) < 70_000


async def test_sandbox_exits(sandboxed):
    r = await sandboxed.execute(call("exits"))
    assert r.error == "exception" and r.content == "Error: tool 'exits' called sys.exit(3)"
    r = await sandboxed.execute(call("hard_exit"))
    assert (r.ok, r.error) == (False, "crashed") and "exited with code 0 without returning a result" in r.content


async def test_sandbox_segfault(sandboxed):
    r = await sandboxed.execute(call("segfault"))
    assert (r.ok, r.error) == (False, "crashed") and "segmentation fault" in r.content


async def test_sandbox_unbounded_memory(sandboxed):
    r = await with_limits(sandboxed, "eats_memory", memory_mb=128).execute(call("eats_memory"), timeout_s=20)
    assert not r.ok and r.error in ("exception", "crashed")
    assert "MemoryError" in r.content or "memory" in r.content


async def test_sandbox_sees_no_server_environment(sandboxed, monkeypatch):
    monkeypatch.setenv("ALI_TEST_SECRET", "hunter2")
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    r = await sandboxed.execute(call("environment"))
    assert r.ok
    seen = json.loads(r.content)
    assert "ALI_TEST_SECRET" not in seen["env"] and "HF_TOKEN" not in seen["env"]
    assert "hunter2" not in r.content and "hf_not_a_real_token" not in r.content
    assert set(seen["env"]) <= {"PATH", "LC_CTYPE"}  # LC_CTYPE: set by Python's C-locale coercion
    assert seen["files"] == [] and seen["cwd"] != os.getcwd() and seen["stdin"] == ""


async def test_sandbox_blocks_processes_and_big_files(sandboxed):
    r = await sandboxed.execute(call("can_fork"))
    if sys.platform == "linux" and os.uname().machine in ("x86_64", "aarch64"):
        assert r.ok and r.content.startswith("blocked"), r.content
    if r.content.startswith("blocked"):  # never run a real fork bomb on an unprotected machine
        r = await sandboxed.execute(call("fork_bomb"), timeout_s=5)
        assert r.error == "exception" and "Operation not permitted" in r.content
    r = await sandboxed.execute(call("big_file"))
    assert r.error == "exception" and "File too large" in r.content


async def test_sandbox_calls_in_parallel_and_the_process_lives_on(sandboxed):
    calls = [call("async_tool", n=i) for i in range(4)] + [call("raises", x=0), call("hard_exit")]
    rs = await asyncio.gather(*(sandboxed.execute(c, timeout_s=20) for c in calls))
    assert [r.ok for r in rs] == [True] * 4 + [False, False]
    assert [r.content for r in rs[:4]] == ["[]", "[0]", "[0, 1]", "[0, 1, 2]"]
    # after everything above, this process still works normally
    assert (await IN_PROCESS.execute(call("not_json"))).ok


SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(not (hasattr(os, "geteuid") and os.geteuid() == 0), reason="only a root server switches users")
async def test_sandbox_as_root_switches_to_nobody(sandboxed):
    r = await sandboxed.execute(call("whoami"))
    assert r.ok
    if not can_drop_privileges(sys.executable):
        # e.g. a pyenv Python under /root: nobody could not even start it, so the code stays root
        assert json.loads(r.content)["uid"] == 0
    if not (os.path.exists(SYSTEM_PYTHON) and can_drop_privileges(SYSTEM_PYTHON)):
        pytest.skip("no world-readable system Python to run the child as nobody")
    # a world-readable interpreter lets the child drop to nobody
    r = await with_limits(sandboxed, "whoami", python=SYSTEM_PYTHON).execute(call("whoami"))
    assert r.ok, r.content
    assert json.loads(r.content) == {"uid": 65534, "gid": 65534, "root_home": "PermissionError"}
