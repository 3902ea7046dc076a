"""The judge: tests run in the worker, on values the job returns. Honest programs pass; lying ones earn nothing."""

from __future__ import annotations

import pytest

from actors.sandbox import Isolation
from tests.actors.sandbox._pool_runner import PoolRunner

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("name", "code", "tests"),
    [
        ("plain values", "x = 1 + 1\ny = 'héllo'\nz = None", "assert x == 2 and y == 'héllo' and z is None"),
        (
            "containers",
            "def f():\n    return {(1, 'a'): [1.5, {2, 3}], 'b': frozenset({b'x'}), 'c': bytearray(b'yz')}",
            "assert f() == {(1, 'a'): [1.5, {2, 3}], 'b': frozenset({b'x'}), 'c': bytearray(b'yz')}",
        ),
        (
            "numbers at the edges",
            "def f():\n    return [2 ** 20000, -(2 ** 20000), float('inf'), 1e-300, complex(1, -2)]",
            "v = f()\nassert v[:2] == [2 ** 20000, -(2 ** 20000)] and v[2] == float('inf')\n"
            "assert v[3] == 1e-300 and v[4] == 1 - 2j\nimport math\nassert math.isnan(f2())",
        ),
        (
            "keywords and defaults",
            "def f(a, b=2, *, c=3):\n    return a + b + c",
            "assert f(1) == 6 and f(1, c=0, b=0) == 1",
        ),
        (
            "builtin subclasses count as their value",
            "from collections import namedtuple, defaultdict, OrderedDict\nP = namedtuple('P', 'x y')\n"
            "def f():\n    d = defaultdict(int)\n    d['a'] += 1\n    return P(1, 2), d, OrderedDict(b=2)",
            "p, d, o = f()\nassert p == (1, 2) and d == {'a': 1} and o == {'b': 2}",
        ),
        (
            "objects stay in the job",
            "class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
            "        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n"
            "    def __len__(self):\n        return len(self.items)\n",
            "s = Stack()\ns.push(1)\ns.push(2)\nassert len(s) == 2 and s.pop() == 2 and s.items == [1]\nassert s == s",
        ),
        (
            "generators and iteration",
            "def gen(n):\n    for i in range(n):\n        yield i * i\n",
            "assert list(gen(4)) == [0, 1, 4, 9]\nassert sum(gen(3)) == 5\nassert 4 in list(gen(3))",
        ),
        (
            "mutated arguments are copied back",
            "def fill(xs, d):\n    xs.sort()\n    d['k'] = len(xs)\n",
            "xs, d = [3, 1, 2], {}\nassert fill(xs, d) is None\nassert xs == [1, 2, 3] and d == {'k': 3}",
        ),
        (
            "exceptions the tests expect",
            "def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n",
            "try:\n    f(-1)\nexcept ValueError as e:\n    assert 'negative' in str(e)\n"
            "else:\n    raise AssertionError",
        ),
        (
            "the job's state after a call",
            "count = 0\ndef bump():\n    global count\n    count += 1\n",
            "assert count == 0\nbump()\nbump()\nassert count == 2",
        ),
        (
            "the standard library",
            "import heapq, bisect, collections, itertools, functools, math, re, fractions, statistics, string\n"
            "def f(xs):\n    return heapq.nsmallest(2, xs), str(fractions.Fraction(1, 3)), math.gcd(12, 18)",
            "assert f([5, 1, 4]) == ([1, 4], '1/3', 6)",
        ),
        (
            "large buffers the job keeps and the tests never read",  # within the job's memory, not the judge's to copy
            "sieve = bytearray(100 << 20)\ndef f(x):\n    return x + 1\n",
            "assert f(1) == 2",
        ),
        ("a large bytes value", "blob = bytes(100 << 20)\ndef f(x):\n    return x + 1\n", "assert f(1) == 2"),
        ("a large int", "big = 1 << (1 << 29)\ndef f(x):\n    return x + 1\n", "assert f(1) == 2"),
        (
            "helpers and loops in the tests",
            "def sq(x):\n    return x * x\n",
            "def check(fn):\n    for i in range(50):\n        assert fn(i) == i ** 2, i\ncheck(sq)",
        ),
    ],
)
def test_honest_programs_pass(sandbox: PoolRunner, name: str, code: str, tests: str) -> None:
    if name == "the standard library" and sandbox.pool.isolation is not Isolation.BWRAP:
        pytest.skip("outside bubblewrap a job reads the host's Python with its own uid's rights (maybe none)")
    if name == "numbers at the edges":
        code += "\ndef f2():\n    return float('nan')"
    result = sandbox.run(code, tests=tests)
    assert result.verdict == "pass", (name, result)


@pytest.mark.parametrize(
    ("name", "code", "tests"),
    [
        (
            "__eq__ always True",
            "class A:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
            "def f(x):\n    return A()",
            "assert f(1) == 2",
        ),
        (
            "int subclass that lies in __eq__ and __repr__",
            "class L(int):\n    def __eq__(self, other):\n        return True\n"
            "    def __repr__(self):\n        return '2'\n"
            "def f(x):\n    return L(3)",
            "assert f(1) == 2",
        ),
        (
            "list subclass that lies",
            "class L(list):\n    def __eq__(self, other):\n        return True\n"
            "    def __len__(self):\n        return 3\n"
            "def f():\n    return L()",
            "assert f() == [1, 2, 3] and len(f()) == 3",
        ),
        (
            "__bool__ always True",
            "class T:\n    def __bool__(self):\n        return True\ndef is_prime(n):\n    return T()",
            "assert is_prime(7)",
        ),
        (
            "__ne__ always False",
            "class N:\n    def __ne__(self, other):\n        return False\ndef f():\n    return N()",
            "assert not (f() != 5)",
        ),
        (
            "shadowed builtins",
            "import builtins\ndef f(x):\n    return 100\nabs = lambda v: 0\nlen = lambda v: 3\n"
            "isinstance = lambda *a: True\n"
            "builtins.abs = abs",
            "assert abs(f(1) - 2) < 1e-9",
        ),
        (
            "hash and __eq__ of a set member",
            "class A:\n    def __eq__(self, other):\n        return True\n"
            "    def __hash__(self):\n        return hash(2)\n"
            "def f():\n    return A()",
            "assert f() in {2, 3}",
        ),
        (
            "an exception the tests expect, raised for every input",
            "def f(x):\n    raise ValueError('no')",
            "assert f(2) == 4",
        ),
    ],
)
def test_lying_objects_earn_nothing(sandbox: PoolRunner, name: str, code: str, tests: str) -> None:
    result = sandbox.run(code, tests=tests)
    assert result.verdict == "fail", (name, result)
    sandbox.still_serves()


def test_a_reference_has_no_truth_value_and_says_why(sandbox: PoolRunner) -> None:
    result = sandbox.run("def f():\n    return object()", tests="assert f()")
    assert result.verdict == "fail" and "truth value" in result.detail, result


def test_patching_the_harness_in_the_job_earns_nothing(sandbox: PoolRunner) -> None:
    # The job process runs a harness that answers the judge's questions; a candidate can rewrite every part of it,
    # but it still only chooses the values the judge compares, and the expected ones are not in its process.
    code = (
        "import sys, gc, json\n"
        "def f(x):\n    return 0\n"
        "harness = [g for g in (fr.f_globals for fr in iter(lambda: None, 0)) if False]\n"
        "frame = sys._getframe()\nwhile frame is not None:\n"
        "    if '_answer' in frame.f_globals:\n"
        "        frame.f_globals['_answer'] = lambda *a: {'v': True}\n"
        "        frame.f_globals['_plain'] = lambda *a: True\n"
        "    frame = frame.f_back\n"
        "text = ' '.join(repr(v) for fr in [sys._getframe()] for v in fr.f_globals.values())\n"
    )
    result = sandbox.run(code, tests="assert f(2) == 4\nassert f(3) == 9")
    assert result.verdict == "fail", result
    sandbox.still_serves()


# Job-side code: count the places in this process's writable memory that hold ``needle``, other than the needle
# itself and the copies this search makes (a byte-level look at everything the job inherited, freed memory included).
RESIDUE = """
import ctypes

def residue(needle):
    copies = []
    for line in open('/proc/self/maps'):
        fields = line.split()
        if fields[1].startswith('rw') and (len(fields) < 6 or not fields[5].startswith('[v')):
            start, end = (int(x, 16) for x in fields[0].split('-'))
            copies.append((start, ctypes.string_at(start, end - start)))
    ours = [(id(data) + 32, id(data) + 32 + len(data)) for _, data in copies]
    ours.append((id(needle) + 32, id(needle) + 32 + len(needle)))
    hits = 0
    for start, data in copies:
        at = data.find(needle)
        while at != -1:
            hits += not any(low <= start + at < high for low, high in ours)
            at = data.find(needle, at + 1)
    return hits

own = 'fw-own-' + str(12345)
print('own', residue(b''.join([b'fw-own-', b'12345'])) > 0)
"""


def test_the_tests_are_not_in_the_job_process(sandbox: PoolRunner) -> None:
    code = RESIDUE + "print('tests', residue(b''.join([b'fw-tests-', b'c3d4'])))\ndef f():\n    return 'wrong'\n"
    result = sandbox.run(code, tests="assert f() == 'fw-tests-' + 'c3d4'")
    assert result.verdict == "fail", result
    assert "own True" in result.stdout and "tests 0" in result.stdout, result  # the search works; no tests in it


def test_a_job_sees_nothing_of_an_earlier_job(sandbox_one: PoolRunner) -> None:
    first = sandbox_one.run("secret = 'fw-earlier-' + str(6789)\nprint(secret)", tests="assert secret")
    assert first.verdict == "pass" and "fw-earlier-6789" in first.stdout, first
    second = sandbox_one.run(RESIDUE + "print('earlier', residue(b''.join([b'fw-earlier-', b'6789'])))")
    assert second.verdict == "pass", second
    assert "own True" in second.stdout and "earlier 0" in second.stdout, second


def test_answers_that_would_flood_the_worker_are_cut_off(sandbox: PoolRunner) -> None:
    # each answer is under the per-message cap; together they are far over what one job may send the judge
    code = "def f(i):\n    return 'x' * (3 << 20)\n"
    result = sandbox.run(code, tests="kept = [f(i) for i in range(200)]\nassert len(kept) == 200", timeout_s=30.0)
    assert result.verdict == "fail" and "answers are over" in result.detail, result
    sandbox.still_serves()
