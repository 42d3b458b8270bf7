"""Canonical problems: the key the train/dev/test split hashes (SPEC 13, split v2), so a problem falls on one side
however it is bracketed, ordered, signed or worded, and whichever family asks it.

SPEC 13 ("Split") is the normative text; this module is the reference. :func:`canonical_problem` turns a question
into a canonical form, or ``None`` when it has none (the split then hashes the question text with its family).

* **Arithmetic** (``expr:`` and the expression's value-level form): any question, of any family, that matches one
  of the *expression templates* (:func:`expression_templates`: chain_sum's, basic_arithmetic's and products'
  wordings, and any a family adds with :func:`register_expression_family`) and whose expression parses. The form
  does not name the family, and the split hashes it without the family, so ``1 + 5`` asked by chain_sum and by
  basic_arithmetic is one problem on one side. Rules:

  - signs are folded: ``a - b`` is ``a + (-b)``, a unary minus distributes over a bracketed sum
    (``5 - ( 3 - 4 )`` is ``5 - 3 + 4``), ``2 - -1`` is ``2 + 1``; ``3 - 6``, ``3 + -6`` and ``-6 + 3`` are one
    form (``sum[+3,-6]``); ``-0`` is ``0``;
  - brackets that do not change the value are dropped, the signed terms of a sum and the factors of a product are
    sorted (commutativity and associativity);
  - a product carries one sign, the product of its factors' signs, in front of its unsigned factors:
    ``3 * -4``, ``-3 * 4`` and ``-( 3 * 4 )`` are all ``-mul[3,4]``. A term that is zero by its shape (``0``, a
    product with such a factor, such a number divided, a sum equal to its own negation like ``3 - 3``) is never
    negative, so ``3 - 0`` is ``3 + 0`` and ``2 * -( 3 - 3 )`` is ``2 * ( 3 - 3 )``.
    A bracketed sum used as a factor is oriented (of the sum and its negation, the one whose sorted signed terms
    join to the smaller string, by code point; the other contributes a sign ``-``), so ``( 1 - 2 ) * 3`` and
    ``( 2 - 1 ) * -3`` agree;
  - ``/`` is floor division (reasoning-gym's), which is not odd in its operands, so a division keeps its order and
    its operands' own signs: ``div[-8,2]`` differs from ``-div[8,2]``.

  No other arithmetic: ``3 + 4`` and ``1 + 6`` differ, ``0`` and ``1`` are kept as terms and factors.
* ``spell_backward``: ``word:`` and the word; ``letter_counting``: ``words:`` and the quoted text (every letter
  asked about the same words is one problem). These keys are family-scoped (hashed with the family).

Adding an arithmetic family: a family whose questions use an existing wording (``Compute 347 + 285.`` is
basic_arithmetic's ``Compute E.``) needs nothing, since every family's questions are matched against every
template; one with a new wording calls ``register_expression_family(name, r"Work out (.+) now\\.")`` at import
(a regular expression with one group, the expression, matched against the whole question). Templates are tried in
registration order; the first that matches and whose expression parses gives the form.

Pure string code: knows nothing about reasoning-gym, hashing, models or the swarm.
"""

from __future__ import annotations

import re

#: Prefix of every arithmetic (family-independent) key.
EXPRESSION_PREFIX = "expr:"

#: How questions state an expression (reasoning-gym 0.1.25 wordings), in the order they are tried.
_EXPRESSION_TEMPLATES: list[re.Pattern[str]] = []
#: Families declared arithmetic (documentation and tests; matching does not depend on the family).
_ARITHMETIC_FAMILIES: set[str] = set()

_WORD_TEMPLATES = {
    "spell_backward": ("word:", re.compile(r"Spell this word backward \(example: sun -> nus\): (\S+)")),
    "letter_counting": ("words:", re.compile(r'How many times does the letter "." appear in the text: "(.+)"\?', re.S)),
}
_TOKEN_RE = re.compile(r" *(?:([0-9]+)|([-+*/()]))")
#: Expressions longer than this are not canonicalised (bounded work on a peer's question).
_MAX_EXPRESSION = 2000
_MAX_DEPTH = 50

#: A value as a sum of signed terms: ``(sign, body)`` with sign +1 or -1 and an unsigned body (a decimal
#: magnitude, ``mul[...]``, ``div[...]``).
_Terms = list[tuple[int, str]]


class _Unparsable(Exception):
    pass


def register_expression_family(name: str, *templates: str) -> None:
    """Declare ``name`` an arithmetic family and add its question ``templates`` (regular expressions, each with
    exactly one capturing group -- the expression -- matched against the whole question, ``re.S``). A template
    already registered is not added twice. Call at import time, before any split is computed: the split of a
    question depends on the table, so every peer must register the same templates."""
    compiled = []
    for text in templates:
        pattern = re.compile(text, re.S)
        if pattern.groups != 1:
            raise ValueError(f"expression template {text!r} must have exactly one group (the expression)")
        compiled.append(pattern)
    _ARITHMETIC_FAMILIES.add(name)
    for pattern in compiled:
        if all(p.pattern != pattern.pattern for p in _EXPRESSION_TEMPLATES):
            _EXPRESSION_TEMPLATES.append(pattern)


def expression_templates() -> tuple[re.Pattern[str], ...]:
    """The expression templates, in the order they are tried."""
    return tuple(_EXPRESSION_TEMPLATES)


def arithmetic_families() -> frozenset[str]:
    """The families declared arithmetic (:func:`register_expression_family`)."""
    return frozenset(_ARITHMETIC_FAMILIES)


register_expression_family("chain_sum", r"State the final answer to the following arithmetic problem: (.+) =")
register_expression_family(
    "basic_arithmetic",
    r"Calculate (.+)\.",
    r"What is (.+)\?",
    r"Solve (.+)\.",
    r"Compute (.+)\.",
    r"Evaluate: (.+)\.",
)
register_expression_family(
    "products", r"Solve the following multiplication: (.+)\. Give only the result as your final answer\."
)


def is_expression_key(key: str) -> bool:
    """Whether a split key is an arithmetic, family-independent one."""
    return key.startswith(EXPRESSION_PREFIX)


def canonical_problem(family: str, question: str) -> str | None:
    """The canonical form of ``question`` of ``family`` (see the module docstring), or ``None`` when it has none
    (the split then hashes the question text)."""
    if family in _WORD_TEMPLATES:
        prefix, word_pattern = _WORD_TEMPLATES[family]
        w = word_pattern.fullmatch(question)
        if w:
            return prefix + w.group(1)
    for pattern in _EXPRESSION_TEMPLATES:
        m = pattern.fullmatch(question)
        if m is None:
            continue
        try:
            return EXPRESSION_PREFIX + canonical_expression(m.group(1))
        except _Unparsable:
            continue
    return None


def canonical_expression(expression: str) -> str:
    """The value-level form of an integer expression over ``+ - * /`` and brackets (``_Unparsable`` otherwise).

    Forms: a value of one term is that term, signed (``5``, ``-5``, ``-mul[3,4]``, ``div[-8,2]``); a value of
    several terms is ``sum[...]`` of its signed terms (``+x`` or ``-x``) sorted by code point; a product is
    ``mul[...]`` of its sorted unsigned factors; a division ``div[a,b]`` of its signed operands.
    """
    if len(expression) > _MAX_EXPRESSION:
        raise _Unparsable
    tokens = _tokenize(expression)
    parser = _Parser(tokens)
    terms = parser.sum(0)
    if parser.pos != len(tokens):
        raise _Unparsable
    return _render(terms)


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
    ``unary := '-'? (integer | '(' sum ')')``. Every node evaluates to a flat list of signed terms."""

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

    def sum(self, depth: int) -> _Terms:
        if depth > _MAX_DEPTH:
            raise _Unparsable
        terms = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.take()
            right = self.term(depth)
            terms = terms + (right if op == "+" else _negate(right))  # a - b == a + (-b); sums flatten
        return terms

    def term(self, depth: int) -> _Terms:
        left = self.unary(depth)
        while self.peek() in ("*", "/"):
            op = self.take()
            right = self.unary(depth)
            left = _multiply(left, right) if op == "*" else [(1, f"div[{_render(left)},{_render(right)}]")]
        return left

    def unary(self, depth: int) -> _Terms:
        token = self.take()
        negated = token == "-"
        if negated:
            token = self.take()
        if token == "(":
            inner = self.sum(depth + 1)
            if self.take() != ")":
                raise _Unparsable
        elif token.isdigit():
            inner = [(1, str(int(token)))]
        else:
            raise _Unparsable
        return _negate(inner) if negated else inner


def _is_zero(body: str) -> bool:
    """Whether a body is zero by its shape, so that it equals its own negation: ``0``; a product with such a
    factor; a division of such a numerator; a sum whose signed terms, negated, are the same terms (``3 - 3``)."""
    if body == "0":
        return True
    if body.startswith("mul["):
        return any(_is_zero(f) for f in _items(body))
    if body.startswith("div["):
        return _is_zero(_items(body)[0])
    if body.startswith("sum["):
        terms = _items(body)
        flipped = [t if _is_zero(t[1:]) else ("-" if t[0] == "+" else "+") + t[1:] for t in terms]
        return sorted(flipped) == sorted(terms)
    return False


def _negate(terms: _Terms) -> _Terms:
    return [(sign if _is_zero(body) else -sign, body) for sign, body in terms]


def _signed(term: tuple[int, str]) -> str:
    return ("+" if term[0] > 0 else "-") + term[1]


def _render(terms: _Terms) -> str:
    """A value's signed form: one term as ``x`` or ``-x``, several as ``sum[...]`` of sorted signed terms."""
    if len(terms) == 1:
        sign, body = terms[0]
        return body if sign > 0 else "-" + body
    return "sum[" + ",".join(sorted(_signed(t) for t in terms)) + "]"


def _as_factor(terms: _Terms) -> tuple[int, str]:
    """A value as a product factor: its sign and unsigned body (a sum oriented to the smaller of itself and its
    negation, so a sign can move out of a bracketed sum)."""
    if len(terms) == 1:
        return terms[0]
    plus = ",".join(sorted(_signed(t) for t in terms))
    minus = ",".join(sorted(_signed(t) for t in _negate(terms)))
    return (-1, f"sum[{minus}]") if minus < plus else (1, f"sum[{plus}]")


def _multiply(left: _Terms, right: _Terms) -> _Terms:
    (s1, f1), (s2, f2) = _as_factor(left), _as_factor(right)
    factors = sorted(_factors(f1) + _factors(f2))
    sign = 1 if any(_is_zero(f) for f in factors) else s1 * s2
    return [(sign, "mul[" + ",".join(factors) + "]")]


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


def _factors(body: str) -> list[str]:
    return _items(body) if body.startswith("mul[") else [body]
