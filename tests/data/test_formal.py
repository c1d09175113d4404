"""The Chomsky-hierarchy task generators against direct reference computations."""

from __future__ import annotations

import math
import random

import pytest
import torch

from attnlab.data import formal
from attnlab.data.formal import TASKS, TERMINATOR


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_fifteen_tasks_in_three_levels():
    levels = [t.level for t in TASKS.values()]
    assert len(TASKS) == 15 and levels.count("regular") == 4 and levels.count("dcf") == 4 and levels.count("cs") == 7


@pytest.mark.parametrize("name", list(TASKS))
def test_shapes_ranges_and_determinism(name):
    task = TASKS[name]
    for length in (1, 2, 3, 4, 5, 6, 17, 40, 41):
        x, y = task.sample(8, length, gen(length))
        expected_in = length - 1 if name == "modular_arithmetic" and length % 2 == 0 else length
        assert x.shape == (8, expected_in) and y.shape == (8, task.output_length(length))
        assert x.dtype == torch.long and y.dtype == torch.long
        assert int(x.min()) >= 0 and int(x.max()) < task.input_vocab
        assert int(y.min()) >= 0 and int(y.max()) < task.n_classes
        x2, y2 = task.sample(8, length, gen(length))
        assert torch.equal(x, x2) and torch.equal(y, y2)
    x3, _ = task.sample(64, 30, gen(1))
    x4, _ = task.sample(64, 30, gen(2))
    assert not torch.equal(x3, x4)  # a different seed gives different strings
    with pytest.raises(ValueError):
        task.sample(1, 0, gen())


def test_parity_and_even_pairs_by_hand():
    x, y = formal.parity_check(256, 12, gen())
    for row, label in zip(x.tolist(), y[:, 0].tolist()):
        assert label == row.count(1) % 2
    x, y = formal.even_pairs(256, 12, gen())
    for row, label in zip(x.tolist(), y[:, 0].tolist()):
        s = "".join(map(str, row))
        pairs = sum(s[i:i + 2] in ("01", "10") for i in range(len(s) - 1))
        assert label == pairs % 2 == int(row[0] != row[-1])


def test_cycle_navigation_walks_the_cycle():
    x, y = formal.cycle_navigation(128, 15, gen())
    for row, label in zip(x.tolist(), y[:, 0].tolist()):
        pos = 0
        for a in row:
            pos = (pos + {0: -1, 1: 0, 2: 1}[a]) % 5
        assert label == pos


def _decode(row: list[int]) -> str:
    symbols = {**{d: str(d) for d in range(5)}, formal.PLUS: "+", formal.MINUS: "-", formal.TIMES: "*"}
    return "".join(symbols[t] for t in row)


def test_modular_arithmetic_uses_operator_precedence():
    P, M, T = formal.PLUS, formal.MINUS, formal.TIMES
    assert formal.evaluate_flat([1, P, 2, T, 3]) == 2  # the paper's examples, mod 5
    assert formal.evaluate_flat([1, M, 1, M, 1]) == 4
    assert formal.evaluate_flat([0, T, 1, P, 4, T, 3, M, 2]) == 0
    x, y = formal.modular_arithmetic(200, 21, gen())
    for row, label in zip(x.tolist(), y[:, 0].tolist()):
        assert label == eval(_decode(row)) % 5  # Python's own precedence as the reference


def _bracket_text(row: list[int]) -> str:
    symbols = {**{d: str(d) for d in range(5)}, formal.PLUS: "+", formal.MINUS: "-", formal.OPEN: "(",
               formal.CLOSE: ")", formal.X_TOKEN: "x", formal.EQUALS: "="}
    return "".join(symbols[t] for t in row)


def test_modular_arithmetic_brackets_against_python_eval():
    assert formal.bracket_expression(1, random.Random(0))[0][0] in range(5)
    for length in (1, 2, 3, 4, 5, 9, 30):
        x, y = formal.modular_arithmetic_brackets(50, length, gen(length))
        for row, label in zip(x.tolist(), y[:, 0].tolist()):
            text = _bracket_text(row)
            assert len(row) == length and text.count("(") == text.count(")")
            assert label == eval(text) % 5


def test_solve_equation_solution_satisfies_the_equation():
    x, y = formal.solve_equation(100, 25, gen())
    for row, answer in zip(x.tolist(), y[:, 0].tolist()):
        text = _bracket_text(row)
        lhs, rhs = text.split("=")
        assert text.count("x") == 1 and len(row) == 25
        assert eval(lhs.replace("x", str(answer))) % 5 == int(rhs)


def test_reverse_duplicate_odds_first_bucket_sort():
    x, y = formal.reverse_string(4, 7, gen())
    assert [r[::-1] for r in x.tolist()] == y.tolist()
    x, y = formal.duplicate_string(4, 7, gen())
    assert [r + r for r in x.tolist()] == y.tolist()
    x, y = formal.odds_first(4, 7, gen())
    assert [r[0::2] + r[1::2] for r in x.tolist()] == y.tolist()  # s1 s3 s5 s7 s2 s4 s6
    x, y = formal.bucket_sort(4, 9, gen())
    assert [sorted(r) for r in x.tolist()] == y.tolist()
    x, y = formal.odds_first(1, 3, gen())
    assert y.tolist() == [[x[0, 0].item(), x[0, 2].item(), x[0, 1].item()]]  # 110 -> 10 1


def test_missing_duplicate_string():
    for length in (2, 9, 10):
        x, y = formal.missing_duplicate_string(64, length, gen(length))
        half = length // 2
        for row, label in zip(x.tolist(), y[:, 0].tolist()):
            assert row.count(formal.MASK_TOKEN) == 1 and row[2 * half:] == [formal.PAD_TOKEN] * (length % 2)
            hole = row.index(formal.MASK_TOKEN)
            twin = hole + half if hole < half else hole - half  # the same symbol in the other copy
            assert row[twin] == label
        # w w has an even number of 1s: the missing symbol is the parity of the visible ones (a regular shortcut)
        assert torch.equal(y[:, 0], (x == 1).sum(dim=1) % 2)
    x, y = formal.missing_duplicate_string(3, 1, gen())
    assert x.tolist() == [[1]] * 3 and y.tolist() == [[1]] * 3


def test_stack_manipulation_simulated():
    # the paper's example: stack 0 1 1 0, PUSH 1, POP, POP -> 1 1 0, terminator, zero padding to length + 1
    for length in (1, 5, 20):
        x, y = formal.stack_manipulation(64, length, gen(length))
        for row, out in zip(x.tolist(), y.tolist()):
            n_stack = next((i for i, t in enumerate(row) if t >= formal.POP), len(row))
            stack = row[:n_stack]
            for a in row[n_stack:]:
                stack = stack[:-1] if a == formal.POP else [*stack, a - formal.PUSH0]
            expected = [*stack[::-1], TERMINATOR]
            assert out == expected + [0] * (length + 1 - len(expected))


def _lsb_value(bits: list[int]) -> int:
    return sum(b << i for i, b in enumerate(bits))


def _split(row: list[int]) -> tuple[int, int]:
    s = row.index(formal.SEPARATOR)
    return _lsb_value(row[:s]), _lsb_value(row[s + 1:])


def test_binary_addition_lsb_first():
    assert formal.lsb_first(18, 5) == [0, 1, 0, 0, 1]  # 18 = 10010 -> 01001 LSB-first, the paper's example
    assert formal.lsb_first(24) == [0, 0, 0, 1, 1]
    for length in (3, 12, 41):
        x, y = formal.binary_addition(64, length, gen(length))
        mask = TASKS["binary_addition"].accuracy_mask(y)
        for row, out, m in zip(x.tolist(), y.tolist(), mask.tolist()):
            n, m_ = _split(row)
            assert n >= 1 and m_ >= 1
            end = out.index(TERMINATOR)
            assert _lsb_value(out[:end]) == n + m_ and out[end - 1] == 1  # no trailing (leading) zeros
            assert all(v == 0 for v in out[end + 1:]) and sum(m) == end + 1


def test_binary_multiplication_lsb_first():
    for length in (3, 12, 41):
        x, y = formal.binary_multiplication(64, length, gen(length))
        for row, out in zip(x.tolist(), y.tolist()):
            n, m = _split(row)
            end = out.index(TERMINATOR)
            assert _lsb_value(out[:end]) == n * m and len(out) == length
    _, y = formal.binary_multiplication(2, 2, gen())
    assert y.tolist() == [[0, TERMINATOR]] * 2


def test_compute_sqrt_big_endian():
    x, y = formal.compute_sqrt(64, 31, gen())
    for row, out in zip(x.tolist(), y.tolist()):
        n = int("".join(map(str, row)), 2)
        assert n >= 1 and int("".join(map(str, out)), 2) == math.isqrt(n) and len(out) == 16


def test_accuracy_mask_stops_at_terminator():
    y = torch.tensor([[1, 0, 2, 0, 0], [2, 0, 0, 0, 0]])
    assert TASKS["binary_addition"].accuracy_mask(y).tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0]]
    assert TASKS["reverse_string"].accuracy_mask(y).all()
