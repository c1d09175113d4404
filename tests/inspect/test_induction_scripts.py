"""scripts/repeated_strings.py and scripts/induction_check.py: the data of the induction study and the
labels that say which tokens a copy can predict."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_repeated_strings_are_two_copies_without_repeats_inside():
    gen = load("repeated_strings")
    text = gen.repeated_strings(5_000, seed=3)
    assert text == gen.repeated_strings(5_000, seed=3) and text != gen.repeated_strings(5_000, seed=4)
    lines = text.rstrip("\n").split("\n")
    assert len(text) >= 5_000
    for line in lines:
        first, second = line.split(" ")
        assert first == second and 6 <= len(first) <= 20 and len(set(first)) == len(first)
        assert set(first) <= set(gen.ALPHABET)


def test_copy_labels_mark_the_copyable_part_of_each_second_copy():
    check = load("induction_check")
    labels = check.copy_labels("abc abc\nxy xy\n")
    #                      a  b  c  _  a  b  c  \n x  y  _  x  y  \n
    assert labels.tolist() == [1, 1, 1, 0, 0, 2, 2, 0, 1, 1, 0, 0, 2, 0]
    assert isinstance(labels, torch.Tensor)
