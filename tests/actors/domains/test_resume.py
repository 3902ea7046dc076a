"""A resumed run whose spec moved tasks the run trained on into a domain's held-out set says so, loudly."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import structlog

from tests.actors.learner._helpers import write_spec
from topology import Spec
from topology.runtime._evolve import check_records, section_records
from topology.runtime._session import open_session

pytestmark = pytest.mark.anyio


def jsonl_spec(folder: Path, heldout: int) -> Spec:
    rows = [{"id": f"r{i}", "prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(40)]
    (folder / "tasks.jsonl").write_bytes(b"\n".join(orjson.dumps(row) for row in rows))
    return write_spec(
        folder, domains=f"  sums: {{source: jsonl:tasks.jsonl, verifier: math, heldout: {heldout}}}\n", name="t"
    )


def arithmetic_spec(folder: Path, heldout: int, fraction: float = 0.1) -> Spec:
    domain = f"{{source: builtin:arithmetic, source_options: {{heldout_fraction: {fraction}}}, verifier: math, "
    return write_spec(folder, domains=f"  arith: {domain}heldout: {heldout}}}\n", name="t")


def test_a_larger_heldout_of_a_task_file_warns_how_many_training_tasks_it_now_holds_out(tmp_path: Path) -> None:
    """A file's `heldout: n` holds out the n rows of smallest hash: raising it takes rows the run trained on."""
    records = section_records(jsonl_spec(tmp_path, 4))
    assert check_records(tmp_path, records, jsonl_spec(tmp_path, 4)) == []
    assert check_records(tmp_path, records, jsonl_spec(tmp_path, 2)) == []  # fewer: none was trained on
    (warning,) = check_records(tmp_path, records, jsonl_spec(tmp_path, 10))
    assert warning.startswith("domains.sums: 6 of its 10 held-out tasks were training tasks before this resume")
    assert "start a new run for a clean measure" in warning


def test_a_builtins_heldout_grows_within_its_bucket_and_a_wider_bucket_warns(tmp_path: Path) -> None:
    """A builtin holds out a hash bucket: more held-out tasks come from the same bucket (nothing trained on moves),
    a larger `heldout_fraction` widens it over tasks the run drew for training."""
    records = section_records(arithmetic_spec(tmp_path, 8))
    assert check_records(tmp_path, records, arithmetic_spec(tmp_path, 50)) == []
    (warning,) = check_records(tmp_path, records, arithmetic_spec(tmp_path, 50, fraction=0.5))
    assert warning.startswith("domains.arith: ") and "of its 50 held-out tasks were training tasks" in warning


async def test_a_resume_that_moves_training_tasks_into_heldout_logs_a_warning_before_anything_starts(
    tmp_path: Path,
) -> None:
    async with open_session(jsonl_spec(tmp_path, 4), run_root=tmp_path / "runs") as session:
        run_dir = session.run_dir
    with structlog.testing.capture_logs() as logs:
        async with open_session(jsonl_spec(tmp_path, 10), resume=run_dir):
            pass
    warnings = [e for e in logs if e["log_level"] == "warning" and e["event"].startswith("domains.sums: 6 of")]
    assert len(warnings) == 1
