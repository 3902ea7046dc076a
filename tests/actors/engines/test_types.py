import dataclasses
import subprocess
import sys

import pytest

from actors.engines import SamplingParams


def test_importing_the_package_does_not_import_torch() -> None:
    code = "import sys, actors.generator; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop": ("",)}, "stop strings"),
    ],
)
def test_sampling_params_reject_nonsense(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_sampling_params_survive_the_wire_and_ignore_unknown_keys() -> None:
    params = SamplingParams(max_new_tokens=7, temperature=0.5, top_k=3, stop=("\n", "."), stop_token_ids=(2,), seed=1)
    wire = params.to_wire()
    assert wire["stop"] == ["\n", "."] and wire["stop_token_ids"] == [2]  # JSON-ready: lists, not tuples
    assert set(wire) == {f.name for f in dataclasses.fields(SamplingParams)}
    assert SamplingParams.from_wire({**wire, "from_a_newer_sender": 1}) == params
