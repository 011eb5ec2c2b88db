"""The ``code`` family: write a short Python function; the reward is the fraction of its unit tests that pass.

Items come from :data:`SPECS`, templated function specs (``sum_multiples(xs)``: "returns the sum of the numbers in
xs that are divisible by 3"). Each spec has parameters drawn per item, an input generator and a reference solution
(a source template): the prompt shows one worked example, and 3-6 further calls are the hidden unit tests, their
expected values computed by running the reference solution here (trusted code) and stored in ``item.meta``.

    item = TASKS["code"].sample(1, seed=0)[0]
    TASKS["code"].format_prompt(item, "chat")      # asks for a ```python block
    TASKS["code"].score(response, item)            # RewardResult(reward=passed/total, correct=all passed, ...)

Splits. Eval holds whole specs that training never sees: a spec statement (the question without its example)
belongs to ``eval`` iff :func:`brorl_lab.rollout.tasks.gym.split_of` puts its text there (1 in 8). Item ``k`` of the stream
``(split, seed)`` is drawn from ``random.Random("code:<split>:<seed>:<k>")``, keeping only its split's specs.

Scoring (ProRL's code reward): the last fenced code block of the response (an unclosed final fence counts, as
truncated samples often lack the closing one), else the whole response, runs in :func:`brorl_lab.rollout.sandbox.
run_untrusted` with a 5 s limit; ``reward = passed / total`` when the run completes, 0 on a syntax or top-level error,
timeout, crash, output flood or when no code was found; ``correct`` = every test passed. ``score`` never raises.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from brorl_lab.core.validation import check_int, is_number
from brorl_lab.rollout.sandbox import UnitTest, run_untrusted
from brorl_lab.rollout.tasks.base import RewardResult, TaskFamily, TaskItem, register_task
from brorl_lab.rollout.tasks.gym import check_sample_args, split_of
from brorl_lab.rollout.tasks.templates import check_template, format_prompt

CHAT_CODE = ("{question}\n\nWrite the complete function in Python and put it in a single ```python code block "
             "(no tests, no input reading).")
MAX_CODE_CHARS = 16_000  # longer extracted code scores 0 without being run
MIN_TESTS, MAX_TESTS = 3, 6
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


@dataclass(frozen=True)
class Spec:
    """A templated function spec. ``text`` and ``solution`` are ``str.format`` templates over the drawn params."""

    name: str  # the function name the tests call
    args: str  # its parameter list, e.g. "xs" or "a, b"
    text: str  # what it returns, completing "Write a Python function `name(args)` that ..."
    params: Callable[[random.Random], dict]
    inputs: Callable[[random.Random, dict], tuple]  # one argument tuple
    solution: str  # reference implementation

    def statement(self, p: dict) -> str:
        return f"Write a Python function `{self.name}({self.args})` that {self.text.format(**p)}."


# ---- input generators ----------------------------------------------------------------------------------------------
def _ints(rng: random.Random, lo: int = -20, hi: int = 20, max_len: int = 8, min_len: int = 0) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(min_len, max_len))]


def _small(rng: random.Random) -> list[int]:  # few distinct values: duplicates, runs and pairs actually occur
    return _ints(rng, 0, 5, 9)


def _word(rng: random.Random, letters: str = "abcdeilmnorst") -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(1, 6)))


def _sentence(rng: random.Random) -> str:
    words = [_word(rng) for _ in range(rng.randint(0, 5))]
    return " ".join(w.upper() if rng.random() < 0.2 else w for w in words)


def _text(rng: random.Random) -> str:
    return "".join(rng.choice("aabbcAE iou.,!xyz") for _ in range(rng.randint(0, 12)))


def _matrix(rng: random.Random, square: bool) -> list[list[int]]:
    rows = rng.randint(1, 4)
    cols = rows if square else rng.randint(1, 4)
    return [[rng.randint(-9, 9) for _ in range(cols)] for _ in range(rows)]


def _none(_rng: random.Random) -> dict:
    return {}


_xs = lambda rng, p: (_ints(rng),)  # noqa: E731
_s = lambda rng, p: (_sentence(rng),)  # noqa: E731


SPECS: tuple[Spec, ...] = (
    # ---- lists of integers -------------------------------------------------------------------------------------
    Spec("sum_multiples", "xs", "returns the sum of the numbers in xs that are divisible by {k}",
         lambda r: {"k": r.randint(2, 7)}, _xs,
         "def sum_multiples(xs):\n    return sum(x for x in xs if x % {k} == 0)\n"),
    Spec("count_greater", "xs", "returns how many numbers in xs are greater than {t}",
         lambda r: {"t": r.randint(-5, 10)}, _xs,
         "def count_greater(xs):\n    return sum(1 for x in xs if x > {t})\n"),
    Spec("spread", "xs", "returns the largest number in xs minus the smallest one, or 0 if xs is empty",
         _none, _xs, "def spread(xs):\n    return max(xs) - min(xs) if xs else 0\n"),
    Spec("scale_shift", "xs", "returns a new list in which each number x of xs becomes {a} * x + {b}",
         lambda r: {"a": r.randint(2, 5), "b": r.randint(-3, 3)}, _xs,
         "def scale_shift(xs):\n    return [{a} * x + {b} for x in xs]\n"),
    Spec("prefix_sums", "xs", "returns the list of running sums of xs (the i-th entry is xs[0] + ... + xs[i])",
         _none, _xs,
         "def prefix_sums(xs):\n    out, t = [], 0\n    for x in xs:\n        t += x\n        out.append(t)\n"
         "    return out\n"),
    Spec("second_largest", "xs", "returns the second largest distinct value in xs, or None if there is none",
         _none, lambda r, p: (_small(r),),
         "def second_largest(xs):\n    v = sorted(set(xs))\n    return v[-2] if len(v) >= 2 else None\n"),
    Spec("remove_value", "xs", "returns xs without any occurrence of {v}, keeping the order of the other numbers",
         lambda r: {"v": r.randint(0, 5)}, lambda r, p: (_small(r),),
         "def remove_value(xs):\n    return [x for x in xs if x != {v}]\n"),
    Spec("rotate_left", "xs", "returns xs rotated left by {k} positions (each step moves the first element to the "
         "end); an empty list stays empty",
         lambda r: {"k": r.randint(1, 4)}, _xs,
         "def rotate_left(xs):\n    if not xs:\n        return []\n    k = {k} % len(xs)\n    return xs[k:] + xs[:k]\n"),
    Spec("chunk_sums", "xs", "returns the sums of consecutive chunks of {k} elements of xs, in order (the last chunk "
         "may be shorter)",
         lambda r: {"k": r.randint(2, 4)}, _xs,
         "def chunk_sums(xs):\n    return [sum(xs[i:i + {k}]) for i in range(0, len(xs), {k})]\n"),
    Spec("count_runs", "xs", "returns the number of maximal runs of equal adjacent elements in xs (0 for an empty "
         "list)", _none, lambda r, p: (_small(r),),
         "def count_runs(xs):\n    return sum(1 for i, x in enumerate(xs) if i == 0 or xs[i - 1] != x)\n"),
    Spec("dedupe", "xs", "returns xs with repeated values removed, keeping the first occurrence of each value",
         _none, lambda r, p: (_small(r),),
         "def dedupe(xs):\n    seen, out = set(), []\n    for x in xs:\n        if x not in seen:\n"
         "            seen.add(x)\n            out.append(x)\n    return out\n"),
    Spec("clamp_all", "xs", "returns xs with each number clamped to the range [{lo}, {hi}]",
         lambda r: {"lo": r.randint(-5, 0), "hi": r.randint(1, 10)}, _xs,
         "def clamp_all(xs):\n    return [min(max(x, {lo}), {hi}) for x in xs]\n"),
    Spec("alternating_sum", "xs", "returns xs[0] - xs[1] + xs[2] - xs[3] + ... (0 for an empty list)",
         _none, _xs, "def alternating_sum(xs):\n    return sum(x if i % 2 == 0 else -x for i, x in enumerate(xs))\n"),
    Spec("product_mod", "xs", "returns the product of the numbers in xs modulo {m} as a number in 0..{m1} (the "
         "empty product is 1)",
         lambda r: {"m": (m := r.choice([7, 11, 13, 17, 19, 23, 97, 101])), "m1": m - 1}, _xs,
         "def product_mod(xs):\n    p = 1\n    for x in xs:\n        p = p * x % {m}\n    return p % {m}\n"),
    Spec("index_of_max", "xs", "returns the index of the first occurrence of the largest number in xs, or -1 if xs "
         "is empty", _none, lambda r, p: (_small(r),),
         "def index_of_max(xs):\n    return xs.index(max(xs)) if xs else -1\n"),
    Spec("pairs_with_sum", "xs", "returns the number of index pairs i < j with xs[i] + xs[j] == {t}",
         lambda r: {"t": r.randint(0, 10)}, lambda r, p: (_small(r),),
         "def pairs_with_sum(xs):\n    n = len(xs)\n"
         "    return sum(1 for i in range(n) for j in range(i + 1, n) if xs[i] + xs[j] == {t})\n"),
    Spec("longest_rise", "xs", "returns the length of the longest run of adjacent, strictly increasing elements of "
         "xs (0 for an empty list)", _none, _xs,
         "def longest_rise(xs):\n    best = cur = 0\n    for i, x in enumerate(xs):\n"
         "        cur = cur + 1 if i and xs[i - 1] < x else 1\n        best = max(best, cur)\n    return best\n"),
    Spec("kth_smallest", "xs", "returns the {k}-th smallest number in xs (counting from 1, duplicates count), or "
         "None if xs has fewer than {k} numbers",
         lambda r: {"k": r.randint(1, 3)}, _xs,
         "def kth_smallest(xs):\n    return sorted(xs)[{k} - 1] if len(xs) >= {k} else None\n"),
    Spec("count_between", "xs", "returns how many numbers x of xs satisfy {lo} <= x <= {hi}",
         lambda r: {"lo": (lo := r.randint(-10, 5)), "hi": lo + r.randint(0, 10)}, _xs,
         "def count_between(xs):\n    return sum(1 for x in xs if {lo} <= x <= {hi})\n"),
    Spec("every_kth", "xs", "returns every {k}-th element of xs, starting with the first",
         lambda r: {"k": r.randint(2, 4)}, _xs, "def every_kth(xs):\n    return xs[::{k}]\n"),
    Spec("odd_squares", "xs", "returns the sum of the squares of the odd numbers in xs",
         _none, _xs, "def odd_squares(xs):\n    return sum(x * x for x in xs if x % 2)\n"),
    Spec("floor_mean", "xs", "returns the mean of xs rounded down to an integer (floor, also for negative means), "
         "or None for an empty list", _none, _xs,
         "def floor_mean(xs):\n    return sum(xs) // len(xs) if xs else None\n"),
    # ---- integers ------------------------------------------------------------------------------------------------
    Spec("digit_sum", "n", "returns the sum of the digits of the non-negative integer n written in base {b}",
         lambda r: {"b": r.randint(2, 10)}, lambda r, p: (r.randint(0, 5000),),
         "def digit_sum(n):\n    s = 0\n    while n:\n        n, d = divmod(n, {b})\n        s += d\n    return s\n"),
    Spec("collatz_steps", "n", "returns how many steps the Collatz map (n -> n // 2 for even n, n -> 3 * n + 1 for "
         "odd n) takes to reach 1 from the positive integer n", _none, lambda r, p: (r.randint(1, 300),),
         "def collatz_steps(n):\n    s = 0\n    while n != 1:\n        n = n // 2 if n % 2 == 0 else 3 * n + 1\n"
         "        s += 1\n    return s\n"),
    Spec("fib_mod", "n", "returns the n-th Fibonacci number modulo {m}, where fib(0) = 0 and fib(1) = 1",
         lambda r: {"m": r.choice([10, 100, 1000, 7, 97, 1009])}, lambda r, p: (r.randint(0, 300),),
         "def fib_mod(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, (a + b) % {m}\n    return a\n"),
    Spec("count_divisors", "n", "returns the number of positive divisors of the positive integer n",
         _none, lambda r, p: (r.randint(1, 600),),
         "def count_divisors(n):\n    return sum(1 for d in range(1, n + 1) if n % d == 0)\n"),
    Spec("is_prime", "n", "returns True if the integer n is a prime number and False otherwise",
         _none, lambda r, p: (r.randint(-3, 200),),
         "def is_prime(n):\n    return n >= 2 and all(n % d for d in range(2, int(n ** 0.5) + 1))\n"),
    Spec("sum_multiples_below", "n", "returns the sum of the positive integers below n that are multiples of {a} "
         "or of {b}", lambda r: {"a": (a := r.randint(2, 5)), "b": r.randint(a + 1, 9)},
         lambda r, p: (r.randint(0, 200),),
         "def sum_multiples_below(n):\n    return sum(i for i in range(1, n) if i % {a} == 0 or i % {b} == 0)\n"),
    Spec("reverse_digits", "n", "returns the integer whose decimal digits are those of n reversed, keeping the sign "
         "(so -120 gives -21)", _none, lambda r, p: (r.randint(-5000, 5000),),
         "def reverse_digits(n):\n    r = int(str(abs(n))[::-1])\n    return -r if n < 0 else r\n"),
    Spec("power_mod", "n", "returns {a} to the power n, modulo {m}, for a non-negative integer n",
         lambda r: {"a": r.randint(2, 9), "m": r.choice([7, 10, 13, 100, 1000])}, lambda r, p: (r.randint(0, 500),),
         "def power_mod(n):\n    return pow({a}, n, {m})\n"),
    Spec("gcd_with", "n", "returns the greatest common divisor of the positive integer n and {k}",
         lambda r: {"k": r.choice([12, 18, 30, 36, 42, 60, 84, 90])}, lambda r, p: (r.randint(1, 400),),
         "def gcd_with(n):\n    a, b = n, {k}\n    while b:\n        a, b = b, a % b\n    return a\n"),
    Spec("count_ones", "n", "returns the number of 1 bits in the binary representation of the non-negative integer "
         "n", _none, lambda r, p: (r.randint(0, 10**6),), "def count_ones(n):\n    return bin(n).count('1')\n"),
    Spec("round_up_to", "n", "returns the smallest integer m >= n that is divisible by {k}",
         lambda r: {"k": r.randint(2, 9)}, lambda r, p: (r.randint(-50, 100),),
         "def round_up_to(n):\n    return -(-n // {k}) * {k}\n"),
    # ---- strings -------------------------------------------------------------------------------------------------
    Spec("count_vowels", "s", "returns the number of vowels (a, e, i, o, u, in lower or upper case) in the string s",
         _none, lambda r, p: (_text(r),),
         "def count_vowels(s):\n    return sum(1 for c in s if c in 'aeiouAEIOU')\n"),
    Spec("shift_letters", "s", "returns s with each lowercase letter moved {k} places forward in the alphabet "
         "(wrapping from z to a); other characters stay as they are",
         lambda r: {"k": r.randint(1, 25)}, lambda r, p: (_text(r),),
         "def shift_letters(s):\n    return ''.join(chr((ord(c) - 97 + {k}) % 26 + 97) if 'a' <= c <= 'z' else c "
         "for c in s)\n"),
    Spec("is_letter_palindrome", "s", "returns True if the letters of s, lower-cased and ignoring every other "
         "character, read the same forwards and backwards, else False", _none,
         lambda r, p: ((w := _word(r, "abc")) + r.choice(["", "x", " ", "A"]) + (w[::-1] if r.random() < 0.6
                                                                                 else _word(r, "abc")),),
         "def is_letter_palindrome(s):\n    t = [c.lower() for c in s if c.isalpha()]\n    return t == t[::-1]\n"),
    Spec("word_lengths", "s", "returns the list of the lengths of the words of s (words are separated by spaces)",
         _none, _s, "def word_lengths(s):\n    return [len(w) for w in s.split()]\n"),
    Spec("run_length", "s", "returns the run-length encoding of s: each maximal run of a character c repeated k "
         "times becomes c followed by k, so 'aaab' gives 'a3b1'", _none,
         lambda r, p: ("".join(r.choice("ab") * r.randint(1, 3) for _ in range(r.randint(0, 5))),),
         "def run_length(s):\n    out, i = [], 0\n    while i < len(s):\n        j = i\n"
         "        while j < len(s) and s[j] == s[i]:\n            j += 1\n        out.append(s[i] + str(j - i))\n"
         "        i = j\n    return ''.join(out)\n"),
    Spec("repeat_chars", "s", "returns s with every character repeated {k} times",
         lambda r: {"k": r.randint(2, 4)}, lambda r, p: (_word(r),),
         "def repeat_chars(s):\n    return ''.join(c * {k} for c in s)\n"),
    Spec("count_char", "s", "returns how many times the character '{c}' occurs in s",
         lambda r: {"c": r.choice("abcde")}, lambda r, p: (_word(r, "abcde") + _word(r, "abcde"),),
         "def count_char(s):\n    return s.count('{c}')\n"),
    Spec("title_words", "s", "returns the words of s (separated by spaces) joined by single spaces, each with its "
         "first letter upper-cased and the rest lower-cased", _none, _s,
         "def title_words(s):\n    return ' '.join(w[0].upper() + w[1:].lower() for w in s.split())\n"),
    Spec("longest_word", "s", "returns the longest word of s (words are separated by spaces; the first one if "
         "several are equally long), or '' if s has no words", _none, _s,
         "def longest_word(s):\n    best = ''\n    for w in s.split():\n        if len(w) > len(best):\n"
         "            best = w\n    return best\n"),
    Spec("upper_every", "s", "returns s with the characters at positions 0, {k}, {k2}, ... (every {k}-th one, "
         "starting with the first) upper-cased and the others unchanged",
         lambda r: {"k": (k := r.randint(2, 4)), "k2": 2 * k}, lambda r, p: (_word(r) + _word(r),),
         "def upper_every(s):\n    return ''.join(c.upper() if i % {k} == 0 else c for i, c in enumerate(s))\n"),
    Spec("reverse_words", "s", "returns the words of s (separated by spaces) in reverse order, joined by single "
         "spaces", _none, _s, "def reverse_words(s):\n    return ' '.join(s.split()[::-1])\n"),
    Spec("char_counts", "s", "returns a dict mapping each character of s to the number of times it occurs in s",
         _none, lambda r, p: (_word(r, "abc") + _word(r, "cde"),),
         "def char_counts(s):\n    d = {{}}\n    for c in s:\n        d[c] = d.get(c, 0) + 1\n    return d\n"),
    # ---- two arguments, matrices ---------------------------------------------------------------------------------
    Spec("merge_sorted", "a, b", "given two lists a and b, each sorted in increasing order, returns the sorted list "
         "of all their elements", _none, lambda r, p: (sorted(_ints(r)), sorted(_ints(r))),
         "def merge_sorted(a, b):\n    return sorted(a + b)\n"),
    Spec("common_values", "a, b", "returns the sorted list of the distinct values that occur both in a and in b",
         _none, lambda r, p: (_small(r), _small(r)),
         "def common_values(a, b):\n    return sorted(set(a) & set(b))\n"),
    Spec("dot", "a, b", "returns the sum of a[i] * b[i] over the positions i that both lists have",
         _none, lambda r, p: (_ints(r, -9, 9), _ints(r, -9, 9)),
         "def dot(a, b):\n    return sum(x * y for x, y in zip(a, b))\n"),
    Spec("hamming", "s, t", "returns the number of positions at which the equal-length strings s and t differ",
         _none, lambda r, p: ((w := _word(r, "ab") * 2), "".join(c if r.random() < 0.6 else "b" for c in w)),
         "def hamming(s, t):\n    return sum(1 for x, y in zip(s, t) if x != y)\n"),
    Spec("transpose", "m", "returns the transpose of the matrix m, given as a non-empty list of equally long rows",
         _none, lambda r, p: (_matrix(r, square=False),),
         "def transpose(m):\n    return [list(col) for col in zip(*m)]\n"),
    Spec("trace", "m", "returns the sum of the main diagonal of the square matrix m (a list of rows)",
         _none, lambda r, p: (_matrix(r, square=True),),
         "def trace(m):\n    return sum(m[i][i] for i in range(len(m)))\n"),
)


@lru_cache(maxsize=1024)
def _reference(source: str, name: str) -> Callable:
    """The reference solution as a function (our own trusted source, run in this process)."""
    ns: dict = {}
    exec(compile(source, f"<reference {name}>", "exec"), ns)
    return ns[name]


def _call_text(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def extract_code(response: Any) -> str | None:
    """The last fenced code block of ``response`` (an unclosed last fence counts), else the whole response stripped;
    None for a non-string or blank response."""
    if not isinstance(response, str):
        return None
    blocks = _FENCE.findall(response)
    code = blocks[-1][1] if blocks else response
    return code.strip("\n") if code.strip() else None


class CodeFamily(TaskFamily):
    """Short Python functions checked by unit tests run in the sandbox; reward = fraction of tests passed."""

    name = "code"
    description = f"write a short Python function ({len(SPECS)} templated specs), scored by 3-6 unit tests"

    def __init__(self, *, wall_timeout: float = 5.0, memory_mb: int = 512):
        if not is_number(wall_timeout) or not 0 < wall_timeout < 3600:
            raise ValueError(f"wall_timeout: got {wall_timeout!r}; allowed: seconds in (0, 3600)")
        check_int('memory_mb', memory_mb, 32)
        self.wall_timeout, self.memory_mb = wall_timeout, memory_mb  # ProRL: 0 reward beyond 5 s

    def make_item(self, rng: random.Random, split: str) -> TaskItem | None:
        """One item drawn from ``rng``, or None when the drawn spec belongs to the other split."""
        spec = rng.choice(SPECS)
        p = spec.params(rng)
        statement = spec.statement(p)
        if split_of(statement) != split:
            return None
        source = spec.solution.format(**p)
        ref = _reference(source, spec.name)
        calls: dict[str, Any] = {}
        for _ in range(20 * MAX_TESTS):  # distinct calls; tiny input spaces may offer fewer
            args = spec.inputs(rng, p)
            calls.setdefault(_call_text(spec.name, args), ref(*args))
            if len(calls) > MAX_TESTS:
                break
        (example, shown), *tests = list(calls.items())[: 1 + rng.randint(MIN_TESTS, MAX_TESTS)]
        question = f"{statement}\nFor example, {example} returns {shown!r}."
        return TaskItem(family=self.name, uid="", question=question, answer=source,
                        meta={"spec": spec.name, "params": p,
                              "tests": [{"call": c, "expected": e} for c, e in tests]})

    def sample(self, count: int, *, seed: int, split: str = "train") -> list[TaskItem]:
        check_sample_args(count, seed, split)
        items: list[TaskItem] = []
        k = 0
        while len(items) < count:
            item = self.make_item(random.Random(f"code:{split}:{seed}:{k}"), split)
            if item is not None:
                item.uid = f"{self.name}:{split}:{seed}:{k}"
                items.append(item)
            k += 1
        return items

    def format_prompt(self, item: TaskItem, template: str = "plain", tokenizer: Any = None) -> str:
        return format_prompt(item.question, template, tokenizer, chat_instruction=CHAT_CODE)

    def score(self, response: str, item: TaskItem, template: str = "plain") -> RewardResult:
        check_template(template)  # a wrong template is the caller's bug; everything about the response scores 0
        try:
            code = extract_code(response)
            if code is None:
                return RewardResult(0.0, False, None, "no code found")
            if len(code) > MAX_CODE_CHARS:
                return RewardResult(0.0, False, code[:200], f"code longer than {MAX_CODE_CHARS} characters")
            tests = [UnitTest(t["call"], t["expected"]) for t in item.meta["tests"]]
            res = run_untrusted(code, tests, wall_timeout=self.wall_timeout, memory_mb=self.memory_mb)
        except Exception as e:  # a broken item or sandbox failure must not kill a training step
            return RewardResult(0.0, False, None, f"verifier error: {type(e).__name__}: {e}"[:300])
        if res.status != "ok":
            return RewardResult(0.0, False, code, f"{res.status}: {res.detail}"[:300])
        return RewardResult(res.fraction, res.passed == res.total, code, res.detail)


register_task(CodeFamily())
