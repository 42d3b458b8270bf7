"""Canonical problems: the key the held-out split hashes, so a re-bracketed or reordered question stays on its side.

SPEC 13 ("Held-out split") is the normative text; this module is the reference. Per family,
:func:`canonical_problem` turns a question into a canonical form, or ``None`` when the family has none (or the
question does not have the family's expected shape); the split then hashes the question text as before.

* ``chain_sum``, ``basic_arithmetic``, ``products``: ``expr:`` and the expression's canonical tree. Brackets that
  do not change the meaning are dropped (a bracketed sum added with ``+``; a bracketed product multiplied), the
  signed terms of a sum and the factors of a product are sorted. Nothing else is rewritten: no arithmetic, no
  sign folding (``3 - 5`` and ``-5 + 3`` differ), and ``/`` (floor division in reasoning-gym) keeps its order and
  its operands' brackets. Two questions share a form only if they are the same problem up to bracketing and
  commutativity.
* ``spell_backward``: ``word:`` and the word; ``letter_counting``: ``words:`` and the quoted text (every letter
  asked about the same words falls on the same side).

Pure string code: knows nothing about reasoning-gym, models or the swarm.
"""

from __future__ import annotations

import re

#: How each family's question states its expression (reasoning-gym 0.1.25 templates).
_EXPRESSION_TEMPLATES = {
    "chain_sum": re.compile(r"State the final answer to the following arithmetic problem: (.+) =\Z", re.S),
    "basic_arithmetic": re.compile(
        r"(?:Calculate (.+)\.|What is (.+)\?|Solve (.+)\.|Compute (.+)\.|Evaluate: (.+)\.)\Z", re.S
    ),
    "products": re.compile(
        r"Solve the following multiplication: (.+)\. Give only the result as your final answer\.\Z", re.S
    ),
}
_WORD_TEMPLATES = {
    "spell_backward": ("word:", re.compile(r"Spell this word backward \(example: sun -> nus\): (\S+)\Z")),
    "letter_counting": (
        "words:",
        re.compile(r'How many times does the letter "." appear in the text: "(.+)"\?\Z', re.S),
    ),
}
_TOKEN_RE = re.compile(r" *(?:([0-9]+)|([-+*/()]))")
#: Expressions longer than this are not canonicalised (bounded work on a peer's question).
_MAX_EXPRESSION = 2000
_MAX_DEPTH = 50


class _Unparsable(Exception):
    pass


def canonical_problem(family: str, question: str) -> str | None:
    """The canonical form of ``question`` of ``family`` (see the module docstring), or ``None`` when the family has
    no canonical form or the question does not parse (the split then hashes the question text)."""
    if family in _WORD_TEMPLATES:
        prefix, word_pattern = _WORD_TEMPLATES[family]
        w = word_pattern.match(question)
        return prefix + w.group(1) if w else None
    pattern = _EXPRESSION_TEMPLATES.get(family)
    m = pattern.match(question) if pattern is not None else None
    if m is None:
        return None
    expression = next(g for g in m.groups() if g is not None)
    try:
        return "expr:" + canonical_expression(expression)
    except _Unparsable:
        return None


def canonical_expression(expression: str) -> str:
    """The canonical tree of an integer expression over ``+ - * /`` and brackets (``_Unparsable`` otherwise).

    Forms: a literal is its decimal integer (``-5``); a sum is ``sum[...]`` of its sorted signed terms (``+x`` or
    ``-x``; the first term's sign is ``+``, a unary minus belongs to the literal or group it precedes); a
    product is ``mul[...]`` of its sorted factors; a division ``div[a,b]``; a negated group ``neg[x]``. Sorting
    is by Unicode code point of the terms' forms.
    """
    if len(expression) > _MAX_EXPRESSION:
        raise _Unparsable
    tokens = _tokenize(expression)
    parser = _Parser(tokens)
    tree = parser.sum(0)
    if parser.pos != len(tokens):
        raise _Unparsable
    return tree


def _tokenize(expression: str) -> list[str]:
    tokens = []
    pos = 0
    text = expression.rstrip(" ")
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise _Unparsable
        tokens.append(m.group(1) or m.group(2))
        pos = m.end()
    return tokens


class _Parser:
    """Recursive descent over ``sum := term (('+'|'-') term)*``, ``term := unary (('*'|'/') unary)*``,
    ``unary := '-'? (integer | '(' sum ')')``. Returns canonical strings; a node's kind is its prefix."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.pos = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise _Unparsable
        self.pos += 1
        return token

    def sum(self, depth: int) -> str:
        if depth > _MAX_DEPTH:
            raise _Unparsable
        terms: list[str] = []
        sign = "+"
        while True:
            operand, bracketed = self.term(depth)
            if sign == "+" and bracketed and operand.startswith("sum["):
                terms.extend(_items(operand))  # a + (b - c) == a + b - c
            else:
                terms.append(sign + operand)
            if self.peek() not in ("+", "-"):
                break
            sign = self.take()
        if len(terms) == 1 and terms[0].startswith("+"):
            return terms[0][1:]
        return "sum[" + ",".join(sorted(terms)) + "]"

    def term(self, depth: int) -> tuple[str, bool]:
        """A product/division chain; also whether it is a single bracketed group (which a sum may flatten)."""
        left, bracketed = self.unary(depth)
        while self.peek() in ("*", "/"):
            op = self.take()
            right, _ = self.unary(depth)
            if op == "*":
                left = "mul[" + ",".join(sorted(_factors(left) + _factors(right))) + "]"
            else:
                left = f"div[{left},{right}]"
            bracketed = False
        return left, bracketed

    def unary(self, depth: int) -> tuple[str, bool]:
        token = self.take()
        negated = token == "-"
        if negated:
            token = self.take()
        if token == "(":
            inner = self.sum(depth + 1)
            if self.take() != ")":
                raise _Unparsable
            return (f"neg[{inner}]", False) if negated else (inner, True)
        if not token.isdigit():
            raise _Unparsable
        return str(-int(token) if negated else int(token)), False


def _items(node: str) -> list[str]:
    """The comma-separated children of ``kind[...]`` (top level only)."""
    body = node[node.index("[") + 1 : -1]
    out, depth, start = [], 0, 0
    for i, ch in enumerate(body):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(body[start:i])
            start = i + 1
    out.append(body[start:])
    return out


def _factors(node: str) -> list[str]:
    return _items(node) if node.startswith("mul[") else [node]
