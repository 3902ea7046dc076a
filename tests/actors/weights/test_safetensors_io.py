"""Our safetensors reader and writer: what the library reads, read into given buffers, rewrites detected."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from actors.weights._mmap import (
    MalformedSafetensors,
    NonFiniteValues,
    map_safetensors,
    read_safetensors_into,
    serialize_safetensors,
    view_safetensors,
    write_safetensors,
)


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {
        "wte.weight": torch.randn(32, 16, generator=gen),
        "ln.bias": torch.randn(16, generator=gen).bfloat16(),
        "steps": torch.arange(5),
        "empty": torch.zeros(0, 3),
        "half": torch.ones(4).half(),
    }


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_what_we_write_the_library_reads_and_what_it_writes_we_read(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    write_safetensors(ours, _state(), metadata={"format": "pt", "version": "3"})
    save_file(_state(), str(theirs))
    assert _equal(load_file(str(ours)), _state())
    assert _equal(read_safetensors_into(theirs), _state())
    assert _equal(map_safetensors(theirs), _state())
    assert _equal(view_safetensors(serialize_safetensors(_state(), metadata={})), _state())
    assert _equal(view_safetensors(bytes(serialize_safetensors(_state(), metadata={}))), _state())


def test_reading_into_matching_buffers_fills_them_and_anything_else_gets_new_tensors(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    write_safetensors(path, _state(1), metadata={"version": "1"})
    buffers = {k: torch.empty_like(v) for k, v in _state().items()}
    got = read_safetensors_into(path, buffers, version="1")
    assert _equal(got, _state(1))
    assert all(got[k].data_ptr() == buffers[k].data_ptr() for k in buffers if buffers[k].numel())
    wrong = {**buffers, "ln.bias": torch.empty(16)}  # a dtype that does not match: no buffer is used
    got = read_safetensors_into(path, wrong)
    assert _equal(got, _state(1)) and got["wte.weight"].data_ptr() != buffers["wte.weight"].data_ptr()


def test_a_same_size_file_is_overwritten_in_place_and_a_stale_version_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    write_safetensors(path, _state(1), metadata={"version": "1"})
    inode = os.stat(path).st_ino
    write_safetensors(path, _state(2), metadata={"version": "2"})
    assert os.stat(path).st_ino == inode
    assert _equal(read_safetensors_into(path, version="2"), _state(2))
    with pytest.raises(MalformedSafetensors, match="holds version '2', expected '1'"):
        read_safetensors_into(path, version="1")


def test_truncated_or_garbage_files_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    write_safetensors(path, _state(), metadata={})
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(MalformedSafetensors, match="truncated"):
        read_safetensors_into(path)
    with pytest.raises(MalformedSafetensors, match="truncated"):
        map_safetensors(path)
    path.write_bytes(b"\xff" * 16)
    with pytest.raises(MalformedSafetensors):
        read_safetensors_into(path)
    with pytest.raises(MalformedSafetensors):
        view_safetensors(b"\x01")


def test_values_are_checked_as_they_are_read(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    state = _state()
    write_safetensors(path, state, metadata={})
    assert read_safetensors_into(path).values_checked
    state["wte.weight"][31, 15] = float("nan")  # the last value of a tensor: the last chunk is checked too
    write_safetensors(path, state, metadata={})
    with pytest.raises(NonFiniteValues, match=r"wte\.weight: contains NaN"):
        read_safetensors_into(path, {k: torch.empty_like(v) for k, v in state.items()})
