"""Loading and checking a spec imports no heavy machinery: `flywheel validate` stays fast."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_validating_a_spec_imports_neither_torch_nor_the_servers() -> None:
    code = (
        "import sys, actors, topology\n"
        "topology.load_spec('specs/embedded.yaml')\n"
        "heavy = sorted(m for m in ('torch', 'fastapi', 'uvicorn', 'ray', 'polars', 'transformers')\n"
        "               if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == ""
