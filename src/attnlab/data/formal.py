"""Formal-language tasks of Delétang et al. (2023), "Neural Networks and the Chomsky Hierarchy".

Fifteen sequence-to-sequence tasks, grouped by the weakest automaton that solves them:

    regular (finite state):        even_pairs, modular_arithmetic, parity_check, cycle_navigation
    deterministic context-free:    modular_arithmetic_brackets, reverse_string, solve_equation, stack_manipulation
    context-sensitive:             duplicate_string, missing_duplicate_string, odds_first, binary_addition,
                                   binary_multiplication, compute_sqrt, bucket_sort

``TASKS[name].sample(batch, length, generator)`` returns ``(inputs (B, T_in), targets (B, T_out))`` of
token ids. ``length`` is the task's *input* length (T_in = length, except modular_arithmetic, which
needs an odd length and uses length - 1 when it is even); T_out = ``output_length(length)``: 1 for the
classification tasks, else as in the paper (e.g. 2·length for duplicate_string, length + 1 for
binary_addition: the sum, a termination token 2, zero padding). For the tasks with a termination
token (stack_manipulation, binary_addition, binary_multiplication) only the positions up to and
including it count for accuracy (``accuracy_mask``); the paper does the same.

Everything is drawn from the given ``torch.Generator`` (tasks built with Python big integers or
recursive grammars seed a ``random.Random`` from it), so a seed fixes every batch. The definitions
follow the paper's reference code (google-deepmind/neural_networks_chomsky_hierarchy), rewritten
here; where its docstring and code disagree (odds_first) we follow the paper's text, see below.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

MODULUS = 5  # modular arithmetic, solve equation and cycle navigation all work modulo 5
BUCKET_VOCAB = 5  # bucket sort sorts strings over {0, ..., 4}
TERMINATOR = 2  # end-of-output token of stack_manipulation and the binary arithmetic tasks

Sampler = Callable[[int, int, torch.Generator], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class FormalTask:
    """One task: its Chomsky level, input alphabet size, output classes and sampler.

    ``input_vocab`` symbols are ids 0..input_vocab-1; a model adds its own blank token after them.
    ``chance`` is the paper's random-guess accuracy (1 / number of output symbols, the terminator
    not counted).
    """

    name: str
    level: str  # "regular" | "dcf" | "cs"
    input_vocab: int
    n_classes: int
    chance: float
    output_length: Callable[[int], int]
    sampler: Sampler
    terminated: bool = False  # accuracy counts positions up to the first TERMINATOR only

    def sample(self, batch: int, length: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """(inputs (B, T_in), targets (B, T_out)) of ``batch`` strings of input length ``length`` >= 1."""
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        return self.sampler(batch, length, generator)

    def accuracy_mask(self, targets: Tensor) -> Tensor:
        """(B, T_out) bool: the output positions that count for per-token accuracy."""
        if not self.terminated:
            return torch.ones_like(targets, dtype=torch.bool)
        first_end = (targets == TERMINATOR).int().argmax(dim=1, keepdim=True)  # (B, 1)
        return torch.arange(targets.size(1)).unsqueeze(0) <= first_end  # (B, T_out)


def _python_rng(generator: torch.Generator) -> random.Random:
    """A Python RNG seeded from the torch generator (for big integers and recursive grammars)."""
    return random.Random(int(torch.randint(2**62, (1,), generator=generator)))


def _bits(batch: int, length: int, g: torch.Generator, vocab: int = 2) -> Tensor:
    return torch.randint(vocab, (batch, length), generator=g)  # (B, T)


# ----------------------------------------------------------------------------- regular

def even_pairs(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Binary string -> 1 if the number of '01' and '10' pairs is odd, else 0 (= first != last)."""
    x = _bits(batch, length, g)
    changes = (x[:, 1:] != x[:, :-1]).sum(dim=1)  # (B,)
    return x, (changes % 2).unsqueeze(1)


def parity_check(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Binary string -> number of 1s modulo 2."""
    x = _bits(batch, length, g)
    return x, (x.sum(dim=1) % 2).unsqueeze(1)


def cycle_navigation(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Moves on a 5-cycle from 0: token 0 = step back, 1 = stay, 2 = step forward -> final position."""
    x = _bits(batch, length, g, vocab=3)
    return x, ((x - 1).sum(dim=1) % MODULUS).unsqueeze(1)


PLUS, MINUS, TIMES = MODULUS, MODULUS + 1, MODULUS + 2  # operator ids after the digits 0..4


def evaluate_flat(tokens: list[int]) -> int:
    """Value mod 5 of d op d op ... d with op in {+, -, *}, '*' binding tighter than '+' and '-'."""
    total, term, sign = 0, tokens[0], 1
    for op, digit in zip(tokens[1::2], tokens[2::2]):
        if op == TIMES:
            term *= digit
        else:
            total += sign * term
            term, sign = digit, (1 if op == PLUS else -1)
    return (total + sign * term) % MODULUS


def modular_arithmetic(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """'d op d op ... d' (digits 0-4, op in + - *) -> its value mod 5. Odd length (even -> length - 1)."""
    length = length if length % 2 == 1 else length - 1
    x = torch.empty(batch, length, dtype=torch.long)
    x[:, 0::2] = torch.randint(MODULUS, (batch, length // 2 + 1), generator=g)
    x[:, 1::2] = MODULUS + torch.randint(3, (batch, length // 2), generator=g)
    y = torch.tensor([evaluate_flat(row) for row in x.tolist()])
    return x, y.unsqueeze(1)


# ----------------------------------------------------------------------------- deterministic context-free

OPEN, CLOSE = MODULUS + 2, MODULUS + 3  # brackets (after + and -) in the bracket tasks
X_TOKEN, EQUALS = MODULUS + 4, MODULUS + 5  # solve_equation's unknown and '='


def bracket_expression(length: int, rng: random.Random) -> tuple[list[int], int]:
    """A random expression of exactly ``length`` tokens over digits, + and - with brackets, and its value.

    length 1: d;  2: -d;  3: (d);  4: (-d);  >= 5: (left op right) with a random split of length - 3
    (the paper's grammar, without '*').
    """
    if length <= 4:
        d = rng.randrange(MODULUS)
        value = d if length in (1, 3) else -d % MODULUS
        core = [d] if length in (1, 3) else [MINUS, d]
        return (core if length <= 2 else [OPEN, *core, CLOSE]), value
    left_length = rng.randrange(1, length - 4 + 1)
    left, lv = bracket_expression(left_length, rng)
    right, rv = bracket_expression(length - 3 - left_length, rng)
    if rng.randrange(2) == 0:
        return [OPEN, *left, PLUS, *right, CLOSE], (lv + rv) % MODULUS
    return [OPEN, *left, MINUS, *right, CLOSE], (lv - rv) % MODULUS


def modular_arithmetic_brackets(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """An expression with brackets, + and - over digits 0-4 (exactly ``length`` tokens) -> its value mod 5."""
    rng = _python_rng(g)
    rows = [bracket_expression(length, rng) for _ in range(batch)]
    return torch.tensor([r[0] for r in rows]), torch.tensor([[r[1]] for r in rows])


def solve_equation(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """'expression with one digit replaced by x = value' -> the digit x (mod 5). Length < 3: all zeros."""
    if length < 3:  # no room for an equation: the paper returns zeros
        return torch.zeros(batch, length, dtype=torch.long), torch.zeros(batch, 1, dtype=torch.long)
    rng = _python_rng(g)
    inputs, answers = [], []
    for _ in range(batch):
        expr, value = bracket_expression(length - 2, rng)
        i = rng.randrange(len(expr))
        while expr[i] >= MODULUS:  # walk right (cyclically) to the next digit
            i = (i + 1) % len(expr)
        answers.append([expr[i]])
        inputs.append([*expr[:i], X_TOKEN, *expr[i + 1:], EQUALS, value])
    return torch.tensor(inputs), torch.tensor(answers)


def reverse_string(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Binary string s_1 ... s_n -> s_n ... s_1."""
    x = _bits(batch, length, g)
    return x, x.flip(1)


POP, PUSH0, PUSH1 = 2, 3, 4  # stack_manipulation's actions, after the stack symbols 0 and 1


def stack_manipulation(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """A stack (bottom to top) then POP / PUSH 0 / PUSH 1 actions -> the final stack, top first,
    a terminator 2, then zeros up to length + 1. POP on an empty stack does nothing."""
    rng = _python_rng(g)
    inputs, outputs = [], []
    for _ in range(batch):
        if length == 1:
            stack, actions = [rng.randrange(2)], []
        else:
            n_stack = rng.randrange(1, length)
            stack = [rng.randrange(2) for _ in range(n_stack)]
            actions = [rng.randrange(POP, PUSH1 + 1) for _ in range(length - n_stack)]
        final = list(stack)
        for a in actions:
            if a == POP:
                if final:
                    final.pop()
            else:
                final.append(a - PUSH0)
        result = [*final[::-1], TERMINATOR]
        inputs.append(stack + actions)
        outputs.append(result + [0] * (length + 1 - len(result)))
    return torch.tensor(inputs), torch.tensor(outputs)


# ----------------------------------------------------------------------------- context-sensitive

def duplicate_string(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """Binary string s -> s s."""
    x = _bits(batch, length, g)
    return x, torch.cat([x, x], dim=1)


MASK_TOKEN, PAD_TOKEN = 2, 3  # missing_duplicate_string's placeholder and odd-length padding


def missing_duplicate_string(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """w w (|w| = length // 2) with one symbol replaced by 2 (and a pad 3 if length is odd) -> that symbol.

    Length 1 has no w: input 1, target 1, as in the paper. Note that w w holds an even number of 1s, so
    the missing symbol is the parity of the visible 1s: a finite-state (parity) shortcut solves this task.
    """
    if length == 1:
        return torch.ones(batch, 1, dtype=torch.long), torch.ones(batch, 1, dtype=torch.long)
    w = _bits(batch, length // 2, g)
    ww = torch.cat([w, w], dim=1)  # (B, 2 * (length // 2))
    hole = torch.randint(ww.size(1), (batch,), generator=g)
    rows = torch.arange(batch)
    target = ww[rows, hole].clone()
    ww[rows, hole] = MASK_TOKEN
    pad = torch.full((batch, length % 2), PAD_TOKEN, dtype=torch.long)
    return torch.cat([ww, pad], dim=1), target.unsqueeze(1)


def odds_first(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """s_1 s_2 ... s_n -> s_1 s_3 s_5 ... s_2 s_4 ... (odd positions, counting from 1, first).

    This is the paper's definition and the reference code's docstring example (110 -> 10 1); the
    reference code itself emits the even positions first, the mirror image, equally hard.
    """
    x = _bits(batch, length, g)
    return x, torch.cat([x[:, 0::2], x[:, 1::2]], dim=1)


SEPARATOR = 2  # the '+' / '*' between the two numbers of binary_addition / binary_multiplication


def lsb_first(n: int, width: int = 0) -> list[int]:
    """Binary digits of n, least significant first, zero-padded to ``width`` (no padding: at least '0')."""
    return [int(c) for c in reversed(format(n, "b").zfill(width))]


def _binary_operands(length: int, rng: random.Random) -> tuple[list[int], int, int]:
    """Two numbers n, m >= 1 written LSB-first with |n| + 1 + |m| = length tokens (|n| random): the
    expression [bits(n), SEPARATOR, bits(m)] and the two values. Written widths may carry leading zeros."""
    len_n = rng.randrange(1, length - 1)
    len_m = length - 1 - len_n
    n, m = rng.randint(1, 2**len_n - 1), rng.randint(1, 2**len_m - 1)
    return [*lsb_first(n, len_n), SEPARATOR, *lsb_first(m, len_m)], n, m


def binary_addition(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """LSB-first 'n + m' -> n + m LSB-first (no trailing zeros), terminator 2, zeros up to length + 1.

    Lengths 1-2 carry one number (< 2^length - 1), no operator; its own binary form is the answer.
    """
    rng = _python_rng(g)
    inputs, outputs = [], []
    for _ in range(batch):
        if length <= 2:
            n = rng.randrange(2**length - 1)
            expression, result = lsb_first(n, length), lsb_first(n)
        else:
            expression, n, m = _binary_operands(length, rng)
            result = lsb_first(n + m)
        inputs.append(expression)
        outputs.append(result + [TERMINATOR] + [0] * (length - len(result)))
    return torch.tensor(inputs), torch.tensor(outputs)


def binary_multiplication(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """LSB-first 'n * m' -> n * m LSB-first (no trailing zeros), terminator 2, zeros up to length.

    Lengths 1-2 carry one number and a fixed answer of length - 1 zeros, as in the paper.
    """
    rng = _python_rng(g)
    inputs, outputs = [], []
    for _ in range(batch):
        if length <= 2:
            expression, result = lsb_first(rng.randrange(2**length - 1), length), [0] * (length - 1)
        else:
            expression, n, m = _binary_operands(length, rng)
            result = lsb_first(n * m)
        inputs.append(expression)
        outputs.append(result + [TERMINATOR] + [0] * (length - 1 - len(result)))
    return torch.tensor(inputs), torch.tensor(outputs)


def compute_sqrt(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """n in [1, 2^length) written MSB-first in ``length`` bits -> floor(sqrt(n)) MSB-first in ceil(length/2) bits."""
    x = _bits(batch, length, g)
    zero = (x == 0).all(dim=1)
    while zero.any():  # n >= 1: redraw the all-zero strings
        x[zero] = _bits(int(zero.sum()), length, g)
        zero = (x == 0).all(dim=1)
    out_len = math.ceil(length / 2)
    roots = [math.isqrt(int("".join(map(str, row)), 2)) for row in x.tolist()]
    y = torch.tensor([[int(c) for c in format(r, "b").zfill(out_len)] for r in roots])
    return x, y


def bucket_sort(batch: int, length: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """String over {0, ..., 4} -> the same symbols sorted ascending."""
    x = _bits(batch, length, g, vocab=BUCKET_VOCAB)
    return x, x.sort(dim=1).values


def _one(_: int) -> int:
    return 1


def _same(n: int) -> int:
    return n


def _plus_one(n: int) -> int:
    return n + 1


def _double(n: int) -> int:
    return 2 * n


def _half_up(n: int) -> int:
    return math.ceil(n / 2)


TASKS: dict[str, FormalTask] = {t.name: t for t in (
    FormalTask("even_pairs", "regular", 2, 2, 0.5, _one, even_pairs),
    FormalTask("modular_arithmetic", "regular", MODULUS + 3, MODULUS, 1 / MODULUS, _one, modular_arithmetic),
    FormalTask("parity_check", "regular", 2, 2, 0.5, _one, parity_check),
    FormalTask("cycle_navigation", "regular", 3, MODULUS, 1 / MODULUS, _one, cycle_navigation),
    FormalTask("modular_arithmetic_brackets", "dcf", MODULUS + 4, MODULUS, 1 / MODULUS, _one,
               modular_arithmetic_brackets),
    FormalTask("reverse_string", "dcf", 2, 2, 0.5, _same, reverse_string),
    FormalTask("solve_equation", "dcf", MODULUS + 6, MODULUS, 1 / MODULUS, _one, solve_equation),
    FormalTask("stack_manipulation", "dcf", 5, 3, 0.5, _plus_one, stack_manipulation, terminated=True),
    FormalTask("duplicate_string", "cs", 2, 2, 0.5, _double, duplicate_string),
    FormalTask("missing_duplicate_string", "cs", 4, 2, 0.5, _one, missing_duplicate_string),
    FormalTask("odds_first", "cs", 2, 2, 0.5, _same, odds_first),
    FormalTask("binary_addition", "cs", 3, 3, 0.5, _plus_one, binary_addition, terminated=True),
    FormalTask("binary_multiplication", "cs", 3, 3, 0.5, _same, binary_multiplication, terminated=True),
    FormalTask("compute_sqrt", "cs", 2, 2, 0.5, _half_up, compute_sqrt),
    FormalTask("bucket_sort", "cs", BUCKET_VOCAB, BUCKET_VOCAB, 1 / BUCKET_VOCAB, _same, bucket_sort),
)}
