"""``-k EXPR``: choose requirements with a pytest-like expression.

Words match case-insensitively as substrings of a requirement's ID (``MEM``,
``COPY-H2D``); combine with ``and``, ``or``, ``not`` and parentheses.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["compile_expression"]

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


def compile_expression(expr: str) -> Callable[[str], bool]:
    """Return a predicate over requirement IDs for ``expr``; raise ValueError if malformed."""
    tokens = _TOKEN.findall(expr)
    if not expr.strip() or "".join(tokens).replace(" ", "") != re.sub(r"\s+", "", expr):
        raise ValueError(f"-k expression {expr!r} is empty or malformed")
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError(f"-k expression {expr!r} ends unexpectedly")
        pos += 1
        return tokens[pos - 1]

    def parse_or() -> Callable[[str], bool]:
        left = parse_and()
        while peek() == "or":
            take()
            right = parse_and()
            left = (lambda a, b: lambda s: a(s) or b(s))(left, right)
        return left

    def parse_and() -> Callable[[str], bool]:
        left = parse_not()
        while peek() == "and":
            take()
            right = parse_not()
            left = (lambda a, b: lambda s: a(s) and b(s))(left, right)
        return left

    def parse_not() -> Callable[[str], bool]:
        if peek() == "not":
            take()
            inner = parse_not()
            return lambda s: not inner(s)
        tok = take()
        if tok == "(":
            inner = parse_or()
            if take() != ")":
                raise ValueError(f"-k expression {expr!r}: missing ')'")
            return inner
        if tok in (")", "and", "or"):
            raise ValueError(f"-k expression {expr!r}: unexpected {tok!r}")
        word = tok.lower()
        return lambda s: word in s.lower()

    pred = parse_or()
    if pos != len(tokens):
        raise ValueError(f"-k expression {expr!r}: unexpected {tokens[pos]!r}")
    return pred
