"""PostgreSQL's node trees as text (``debug_print_parse``, ``pg_node_tree`` columns), read
into Python: what a statement's calls resolved to, by OID, and the types of their arguments.

The text is outfuncs.c's: ``{NODE :field value …}``, lists in parentheses (``(i 1 2)``,
``(o 96)``, ``(b 3)`` for integers, OIDs and bitmapsets), ``<>`` for NULL, a constant's
bytes in brackets after its length, and backslash escapes in tokens.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

_SEPARATORS = " \n\t(){}"
_LIST_TAGS = frozenset({"i", "o", "b", "x"})


@dataclass
class Node:
    """One node: its kind (``FUNCEXPR``) and its fields, values as read (text, lists, nodes)."""

    kind: str
    fields: dict[str, Any] = field(default_factory=dict)

    def text(self, name: str) -> str:
        value = self.fields[name]
        if not isinstance(value, str):
            raise TypeError(f"{self.kind}.{name} is not a scalar: {value!r}")
        return value

    def number(self, name: str) -> int:
        return int(self.text(name))


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        char = text[i]
        if char in " \n\t":
            i += 1
        elif char in "(){}":
            out.append(char)
            i += 1
        else:
            token: list[str] = []
            while i < n and text[i] not in _SEPARATORS:
                if text[i] == "\\" and i + 1 < n:
                    token.append(text[i + 1])
                    i += 2
                    continue
                token.append(text[i])
                i += 1
            out.append("".join(token))
    return out


class _Reader:
    def __init__(self, text: str) -> None:
        self._tokens = _tokens(text)
        self._at = 0

    def _peek(self) -> str | None:
        return self._tokens[self._at] if self._at < len(self._tokens) else None

    def _next(self) -> str:
        token = self._tokens[self._at]
        self._at += 1
        return token

    def value(self) -> Any:
        token = self._next()
        if token == "{":
            node = Node(self._next())
            while self._peek() != "}":
                if not (self._peek() or "").startswith(":"):
                    # A raw parse node's variant written before its fields (A_EXPR IN)
                    node.fields.setdefault("", []).append(self.value())
                    continue
                name = self._next()
                node.fields[name[1:]] = self.value()
                if self._peek() == "[":  # a constant's bytes follow its length
                    while self._next() != "]":
                        pass
            self._next()
            return node
        if token == "(":
            items = []
            if self._peek() in _LIST_TAGS:
                self._next()
            while self._peek() != ")":
                items.append(self.value())
            self._next()
            return items
        return None if token == "<>" else token


def read_tree(text: str) -> Any:
    """The tree ``text`` prints: a node, or a list of them."""
    return _Reader(text).value()


def walk(tree: Any) -> Iterator[Node]:
    """Every node of ``tree``, parents first."""
    if isinstance(tree, Node):
        yield tree
        for value in tree.fields.values():
            yield from walk(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from walk(item)


# Fields that name a function or an operator by OID (a sort clause's operators come from the
# type's default operator class, never from a name, but are listed for completeness).
OID_FIELDS = frozenset(
    {
        "funcid",
        "opno",
        "opfuncid",
        "hashfuncid",
        "negfuncid",
        "aggfnoid",
        "winfnoid",
        "eqop",
        "sortop",
        "opnos",
        "startInRangeFunc",
        "endInRangeFunc",
    }
)


def resolved_oids(tree: Any) -> set[int]:
    """Every function and operator OID the tree names."""
    found: set[int] = set()
    for node in walk(tree):
        for name in OID_FIELDS & node.fields.keys():
            value = node.fields[name]
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str) and item.isdigit():
                    found.add(int(item))
    return found


def type_oids(tree: Any) -> set[int]:
    """Every type OID the tree mentions (the types of its values, columns and results)."""
    found: set[int] = set()
    for node in walk(tree):
        for name, value in node.fields.items():
            if "typ" not in name.lower() or name.endswith("mod"):
                continue
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, str) and item.isdigit() and int(item) > 0:
                    found.add(int(item))
    return found


# CoercionForm: a cast the parser added to make an argument fit (COERCE_IMPLICIT_CAST), and
# a call the grammar wrote for special syntax, always qualified (COERCE_SQL_SYNTAX, 14+).
EXPLICIT_CALL, IMPLICIT_CAST, SQL_SYNTAX = "0", "2", "3"
_IMPLICIT = {
    "FUNCEXPR": "funcformat",
    "RELABELTYPE": "relabelformat",
    "COERCEVIAIO": "coerceformat",
    "ARRAYCOERCEEXPR": "coerceformat",
}
_RESULT_TYPE = {
    "VAR": "vartype",
    "CONST": "consttype",
    "PARAM": "paramtype",
    "AGGREF": "aggtype",
    "WINDOWFUNC": "wintype",
    "FUNCEXPR": "funcresulttype",
    "OPEXPR": "opresulttype",
    "DISTINCTEXPR": "opresulttype",
    "NULLIFEXPR": "opresulttype",
    "RELABELTYPE": "resulttype",
    "COERCEVIAIO": "resulttype",
    "ARRAYCOERCEEXPR": "resulttype",
    "CONVERTROWTYPEEXPR": "resulttype",
    "COERCETODOMAIN": "resulttype",
    "FIELDSELECT": "resulttype",
    "CASEEXPR": "casetype",
    "CASETESTEXPR": "typeId",
    "ARRAYEXPR": "array_typeid",
    "ROWEXPR": "row_typeid",
    "COALESCEEXPR": "coalescetype",
    "MINMAXEXPR": "minmaxtype",
    "SQLVALUEFUNCTION": "type",
    "SETTODEFAULT": "typeId",
    "NEXTVALUEEXPR": "typeId",
}
_BOOLEAN = frozenset(
    {"BOOLEXPR", "NULLTEST", "BOOLEANTEST", "SCALARARRAYOPEXPR", "ROWCOMPAREEXPR", "CURRENTOFEXPR"}
)
BOOL_OID = 16
# SubLinkType: EXISTS, ALL, ANY, ROWCOMPARE (boolean); EXPR (its one column); ARRAY.
_EXPR_SUBLINK, _ARRAY_SUBLINK = "4", "6"


class UnknownNode(Exception):
    """A node whose type this reader cannot tell: teach :func:`expr_type` its field."""


def expr_type(node: Any, array_of: Mapping[int, int]) -> int:
    """The type OID of the expression ``node`` (``array_of``: element type → array type)."""
    if not isinstance(node, Node):
        raise UnknownNode(f"not an expression node: {node!r}")
    if node.kind in _RESULT_TYPE:
        return node.number(_RESULT_TYPE[node.kind])
    if node.kind in _BOOLEAN:
        return BOOL_OID
    if node.kind in ("NAMEDARGEXPR", "COLLATEEXPR", "TARGETENTRY"):
        return expr_type(node.fields["arg" if node.kind != "TARGETENTRY" else "expr"], array_of)
    if node.kind == "SUBLINK":
        kind = node.text("subLinkType")
        if kind not in (_EXPR_SUBLINK, _ARRAY_SUBLINK):
            return BOOL_OID
        first = next(t for t in node.fields["subselect"].fields["targetList"] if not _junk(t))
        column = expr_type(first, array_of)
        return column if kind == _EXPR_SUBLINK else array_of[column]
    raise UnknownNode(f"the type of a {node.kind} node")


def _junk(entry: Node) -> bool:
    return entry.fields.get("resjunk") == "true"


def before_implicit_casts(node: Any) -> Any:
    """The expression as written: ``node`` without the casts the parser put around it."""
    while isinstance(node, Node) and node.kind in _IMPLICIT:
        if node.fields.get(_IMPLICIT[node.kind]) != IMPLICIT_CAST:
            break
        # a cast function's first argument is the value; the others say its length
        node = node.fields["args"][0] if node.kind == "FUNCEXPR" else node.fields["arg"]
    return node
