"""A real vLLM OpenAI-compatible server as a child process, for tests (the ``vllm_server``
fixture in conftest.py) and for comparing the server backend with the in-process engine."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

from backend.generators.base import GenerationError
from backend.generators.vllm_cpu import configure_cpu_env, cpu_auto_dtype, on_cpu


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LocalVLLMServer:
    """``python -m vllm.entrypoints.openai.api_server`` as a child process.

    ``start()`` waits for ``/health``; ``stop()`` terminates it by PID (then kills it). The log
    goes to ``log_path`` (a temp file by default); :meth:`log_tail` reads its end. On CPU the
    child gets the same environment defaults as the in-process engine (see
    ``backend.generators.vllm_cpu.configure_cpu_env``), ``--enforce-eager`` and, on x86 CPUs
    without native bf16, ``--dtype float32`` (unless ``extra_args`` say otherwise).
    """

    def __init__(
        self,
        model: str,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        extra_args: list[str] | tuple[str, ...] = (),
        log_path: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.model = model
        self.host = host
        self.port = port or free_port(host)
        self.extra_args = list(extra_args)
        self.log_path = log_path
        self.env = dict(env or {})
        self.proc: Any = None
        self.start_seconds: float | None = None
        self._log_file: Any = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
               "--host", self.host, "--port", str(self.port)]
        if on_cpu():
            if "--enforce-eager" not in self.extra_args:
                cmd.append("--enforce-eager")
            auto = cpu_auto_dtype()
            if auto and "--dtype" not in self.extra_args:
                cmd += ["--dtype", auto]
        return cmd + self.extra_args

    def start(self, timeout_s: float = 300) -> LocalVLLMServer:
        if on_cpu():
            configure_cpu_env()
        env = dict(os.environ)
        env.update(self.env)
        if self.log_path is None:
            fd, self.log_path = tempfile.mkstemp(prefix="ali-vllm-server-", suffix=".log")
            os.close(fd)
        self._log_file = open(self.log_path, "ab")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            self.command(), stdout=self._log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                self._close_log()
                raise GenerationError(
                    f"vLLM server exited with code {self.proc.returncode} while starting; log tail:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise GenerationError(f"vLLM server not healthy after {timeout_s:.0f} s; log tail:\n{self.log_tail()}")
            time.sleep(0.5)
        self.start_seconds = time.perf_counter() - t0
        return self

    def log_tail(self, n: int = 60) -> str:
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 64_000))
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def stop(self, timeout_s: float = 30) -> None:
        """Terminate the server (its process group: vLLM's engine core is a child) by PID."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                proc.terminate()
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    proc.kill()
                proc.wait(timeout=10)
        self._close_log()

    def __enter__(self) -> LocalVLLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
