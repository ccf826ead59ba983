"""The vendored recipe of the shipped SWE-style tasks: small pure-Python libraries from PyPI whose
sdists carry their own tests, each with a bug injected (one exact text replacement) so that named
tests fail. FAIL_TO_PASS and PASS_TO_PASS are not written here: the builder finds them by running
the tests on the original and on the buggy tree."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TaskRecipe:
    task_id: str
    package: str  # pip requirement of the sdist, pinned
    file: str  # relative to the sdist's root
    old: str  # exact text, found once in ``file``
    new: str  # the bug
    test_file: str  # the tests that run (and whose outcomes score)
    problem: str  # the issue, as a user would file it
    pythonpath: str = ""  # e.g. "src" for a src layout
    test_deps: tuple[str, ...] = field(default_factory=tuple)  # installed into the image from PyPI


INFLECTION = "inflection==0.5.1"
CACHETOOLS = "cachetools==5.5.0"
TOOLZ = "toolz==1.0.0"
MORE_ITERTOOLS = "more-itertools==10.5.0"

LRU_END = "        except KeyError:\n            self.__order[key] = None\n\n\nclass MRU"  # LRUCache's, not FIFO's

RECIPES: tuple[TaskRecipe, ...] = (
    TaskRecipe(
        "inflection-dasherize", INFLECTION, "inflection/__init__.py",
        "    return word.replace('_', '-')", "    return word.replace('_', '')", "test_inflection.py",
        "dasherize('puni_puni') returns 'punipuni' instead of 'puni-puni': underscores are dropped.",
    ),
    TaskRecipe(
        "inflection-ordinal", INFLECTION, "inflection/__init__.py",
        "    if number % 100 in (11, 12, 13):", "    if number % 100 in (11, 12):", "test_inflection.py",
        "ordinal(13) returns 'rd' but should be 'th' (and ordinalize(113) gives '113rd').",
    ),
    TaskRecipe(
        "cachetools-lru-order", CACHETOOLS, "src/cachetools/__init__.py",
        f"            self.__order.move_to_end(key)\n{LRU_END}",
        f"            self.__order.move_to_end(key, last=False)\n{LRU_END}",
        "tests/test_lru.py", "LRUCache evicts the most recently used item instead of the least recently used one.",
        pythonpath="src",
    ),
    TaskRecipe(
        "cachetools-fifo-order", CACHETOOLS, "src/cachetools/__init__.py",
        '"""Remove and return the `(key, value)` pair first inserted."""\n        try:\n'
        "            key = next(iter(self.__order))",
        '"""Remove and return the `(key, value)` pair first inserted."""\n        try:\n'
        "            key = next(reversed(self.__order))",
        "tests/test_fifo.py", "FIFOCache.popitem() removes the newest item, not the first inserted.", pythonpath="src",
    ),
    TaskRecipe(
        "toolz-frequencies", TOOLZ, "toolz/itertoolz.py",
        "        d[item] += 1\n    return dict(d)", "        d[item] = 1\n    return dict(d)",
        "toolz/tests/test_itertoolz.py",
        "frequencies(['cat', 'cat', 'ox']) returns {'cat': 1, 'ox': 1}: counts stop at 1.",
    ),
    TaskRecipe(
        "toolz-merge-with", TOOLZ, "toolz/dicttoolz.py",
        "            values[k](v)", "            values[k] = [v].append",
        "toolz/tests/test_dicttoolz.py", "merge_with(sum, {1: 1}, {1: 2}) gives {1: 2} instead of {1: 3}.",
    ),
    TaskRecipe(
        "more-itertools-chunked", MORE_ITERTOOLS, "more_itertools/more.py",
        "    iterator = iter(partial(take, n, iter(iterable)), [])",
        "    iterator = iter(partial(take, n + 1, iter(iterable)), [])",
        "tests/test_more.py", "chunked([1, 2, 3, 4], 2) yields [[1, 2, 3], [4]]: chunks are one too long.",
    ),
    TaskRecipe(
        "more-itertools-ilen", MORE_ITERTOOLS, "more_itertools/more.py",
        "    return sum(compress(repeat(1), zip(iterable)))",
        "    return sum(compress(repeat(1), zip(iterable))) - 1",
        "tests/test_more.py", "ilen(range(5)) returns 4; the length of an iterable is off by one.",
    ),
)  # fmt: skip
