"""Whether every call in the product's SQL resolves to ``pg_catalog`` whatever the session's
``search_path`` holds (tests/security/test_exact_calls.py).

PostgreSQL resolves a function or operator name against every schema on the path
(``pg_catalog`` first); an exact match of the argument types wins wherever it is, so a call
whose ``pg_catalog`` candidate needs an implicit cast (or is polymorphic, variadic, or meets
an unknown-typed literal or parameter) is taken by a same-named object with the exact types in
any schema on the path. This module:

* finds every SQL text of the product (:func:`product_sql`): module-level strings that look
  like SQL, and every SQL-looking literal in the source (:func:`source_literals`), which must
  each be a statement, a part of one, or a statement listed as one that calls nothing;
* reads what each statement's calls resolved to from PostgreSQL's parse tree
  (``debug_print_parse``), by OID, through ``PREPARE`` as the product's driver does;
* plants *shadows* in a schema of their own (:func:`plant_shadows`): for every name and
  operator symbol the statements call, the signatures that reach ``pg_catalog``'s own
  candidates only by implicit casts (from the catalog, in SQL: :data:`CATALOG_SHADOWS`), and
  the exact argument types of every call in the statements (for what the catalog cannot
  enumerate: polymorphic and variadic candidates). Each shadow raises when called.

A statement whose parse tree names a shadow, or that no longer prepares once they are there,
does not resolve its calls to ``pg_catalog`` alone.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from tests.support.node_trees import (
    EXPLICIT_CALL,
    Node,
    UnknownNode,
    before_implicit_casts,
    expr_type,
    read_tree,
    resolved_oids,
    type_oids,
    walk,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("relay", "health", "scoring", "pgconnect", "migrations", "outbox_relay")
SHADOW_SCHEMA = "exact_shadow"

# Text that reads as SQL: it starts with a statement or clause keyword, or it holds a clause,
# a cast, a parameter or a NULL. Keywords are written in capitals throughout the product.
_STARTS = re.compile(
    r"[\s(]*(?:(SELECT|WITH|INSERT|UPDATE|DELETE|SET|BEGIN|COMMIT|ROLLBACK|SAVEPOINT|RELEASE|"
    r"CREATE|DROP|ALTER|GRANT|REVOKE|FROM|WHERE|CASE|CROSS JOIN|JOIN|ON CONFLICT)\b|DO \$)"
)
_HOLDS = re.compile(
    r"\b(SELECT|FROM|WHERE|CASE WHEN|IS NOT NULL|IS NULL|NULL|IN \()|::[a-z]|\$\d|OPERATOR\("
)
_SINGLE_WORD = re.compile(r"\s*[A-Za-z_]+\s*")
_FIELD = re.compile(r"\{\w*\}")


def looks_like_sql(text: str) -> bool:
    """Whether ``text`` (an f-string's placeholders written ``{}``) reads as SQL."""
    if _SINGLE_WORD.fullmatch(text):
        return False  # a privilege name, a keyword on its own
    return bool(_STARTS.match(text) or _HOLDS.search(text))


def pieces(text: str) -> list[str]:
    """The literal parts of a template (``{name}`` and ``{}`` fields cut out), each stripped;
    what any statement built from it holds verbatim."""
    parts = _FIELD.split(text.replace("{{", "{").replace("}}", "}"))
    return [p.strip() for p in parts if p.strip()]


# -- the product's SQL -------------------------------------------------------------------------
def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        root = importlib.import_module(package)
        names.append(package)
        names += [
            info.name
            for info in pkgutil.walk_packages(root.__path__, f"{package}.")
            if not info.name.endswith(".__main__")  # runs the command line when imported
        ]
    return names


def _path_of(module: str) -> Path:
    file = importlib.import_module(module).__file__
    assert file is not None
    return Path(file)


def _assigned_names(module: str) -> set[str]:
    """Names a module assigns at its top level (not those it imports)."""
    tree = ast.parse(_path_of(module).read_text("utf-8"))
    names: set[str] = set()
    for node in tree.body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def product_sql() -> dict[str, str]:
    """Every module-level string of the product that reads as SQL, by ``module.NAME`` of the
    module that defines it (a text imported into other modules counted once)."""
    found: dict[str, str] = {}
    for module in _modules():
        defined = _assigned_names(module)
        for name, value in vars(importlib.import_module(module)).items():
            if name in defined and isinstance(value, str) and looks_like_sql(value):
                found.setdefault(value, f"{module}.{name}")
    return {name: text for text, name in found.items()}


@dataclass(frozen=True)
class Literal:
    """A string literal of the product's source that reads as SQL."""

    where: str  # path:line
    text: str  # an f-string with its placeholders as {}
    template: bool  # an f-string, or a str.format template with fields


def source_literals() -> list[Literal]:
    """Every literal in the product's source that reads as SQL (docstrings left out)."""
    found = []
    for module in _modules():
        path = _path_of(module)
        tree = ast.parse(path.read_text("utf-8"))
        skip: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                skip.add(id(node.value))  # a docstring, module, class or attribute
            if isinstance(node, ast.JoinedStr):
                skip |= {id(part) for part in node.values}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text, template = node.value, bool(_FIELD.search(node.value))
            elif isinstance(node, ast.JoinedStr):
                text = "".join(
                    str(p.value) if isinstance(p, ast.Constant) else "{}" for p in node.values
                )
                template = True
            else:
                continue
            if looks_like_sql(text):
                where = f"{path.relative_to(ROOT).as_posix()}:{node.lineno}"
                found.append(Literal(where, text, template))
    return found


def covered_by(text: str, statements: Iterable[str]) -> bool:
    """Whether every literal part of ``text`` is part of one of ``statements``."""
    bodies = list(statements)
    return all(any(piece in body for body in bodies) for piece in pieces(text))


# -- what a statement's calls resolve to -----------------------------------------------------------
class ParseTrees:
    """A connection that prints the parse tree of every statement it prepares."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self._conn = conn
        self._heard: list[str] = []
        conn.add_log_listener(self._listen)

    def stop(self) -> None:
        """Stop listening (a pool's connection must have no listener when released)."""
        self._conn.remove_log_listener(self._listen)

    def _listen(self, _conn: object, message: Any) -> None:
        if message.message.startswith("parse tree"):
            self._heard.append(message.detail or "")

    async def tree(self, text: str) -> Any:
        """The parse tree of ``text``, prepared as ``PREPARE`` does it (parameter types
        inferred, as the driver leaves them); :class:`asyncpg.PostgresError` if it does not
        prepare."""
        await self._conn.execute(
            "SET debug_print_parse = on; SET debug_pretty_print = off; "
            "SET client_min_messages = log"
        )
        self._heard.clear()
        try:
            await self._conn.execute(f"PREPARE exact_calls_probe AS {text}")
            await self._conn.execute("DEALLOCATE exact_calls_probe")
        finally:
            await self._conn.execute("SET client_min_messages = notice; RESET debug_print_parse")
        # The first tree is the PREPARE's own statement; nothing else runs in between.
        trees = [read_tree(detail) for detail in self._heard]
        return next((tree for tree in trees if _utility_free(tree)), trees[-1] if trees else None)

    async def driver_queries(self, text: str) -> bool:
        """Whether the driver runs a query of its own to prepare ``text``: asyncpg's type
        introspection, for a type it has no codec for (that query is asyncpg's, and not
        exact). Seen as a second parse tree, or, once asyncpg keeps that query prepared, as
        a shadow on the path raising in it."""
        await self._conn.execute(
            "SET debug_print_parse = on; SET debug_pretty_print = off; "
            "SET client_min_messages = log"
        )
        self._heard.clear()
        try:
            await self._conn.prepare(text)
            return len(self._heard) > 1
        except asyncpg.RaiseError as exc:
            if "exact-calls shadow" in str(exc):
                return True
            raise
        finally:
            await self._conn.execute("SET client_min_messages = notice; RESET debug_print_parse")


def _utility_free(tree: Any) -> bool:
    # PREPARE itself prints as a utility query; its statement is the other tree.
    queries = tree if isinstance(tree, list) else [tree]
    return any(isinstance(q, Node) and q.fields.get("utilityStmt") in (None, "<>") for q in queries)


@dataclass(frozen=True)
class Call:
    """One call in a statement, as written: the callee, and its arguments' types before any
    cast the parser added (a parameter's as inferred; a literal's as resolved)."""

    kind: str  # "function" or "operator"
    callee: int  # pg_proc or pg_operator OID
    arg_types: tuple[int, ...]
    arg_names: tuple[str | None, ...]
    result_type: int


def calls_in(tree: Any, array_of: Mapping[int, int], element_of: Mapping[int, int]) -> list[Call]:
    """Every call of a function, aggregate, window function or operator in ``tree`` that the
    parser resolved by name (calls the grammar writes for special syntax are qualified)."""
    calls = []
    for node in walk(tree):
        if node.kind == "FUNCEXPR" and node.text("funcformat") == EXPLICIT_CALL:
            calls.append(_function_call(node, "funcid", node.fields["args"] or [], array_of))
        elif node.kind == "AGGREF" and node.fields.get("aggstar") != "true":
            args = [entry for entry in node.fields["args"] or [] if not _junk(entry)]
            calls.append(_function_call(node, "aggfnoid", args, array_of))
        elif node.kind == "WINDOWFUNC" and node.fields.get("winstar") != "true":
            calls.append(_function_call(node, "winfnoid", node.fields["args"] or [], array_of))
        elif node.kind in ("OPEXPR", "DISTINCTEXPR", "NULLIFEXPR", "SCALARARRAYOPEXPR"):
            types = [_written_type(arg, array_of) for arg in node.fields["args"]]
            if node.kind == "SCALARARRAYOPEXPR":  # x op ANY (array): the operator's right is
                types[1] = element_of[types[1]]  # the element
            if len(types) == 1:  # a prefix operator
                types.insert(0, 0)
            result = expr_type(node, array_of)
            calls.append(Call("operator", node.number("opno"), tuple(types), (), result))
    return calls


def _junk(entry: Node) -> bool:
    return entry.fields.get("resjunk") == "true"


def _written_type(arg: Any, array_of: Mapping[int, int]) -> int:
    return expr_type(before_implicit_casts(arg), array_of)


def _function_call(
    node: Node, field_name: str, args: list[Any], array_of: Mapping[int, int]
) -> Call:
    args = [arg.fields["expr"] if arg.kind == "TARGETENTRY" else arg for arg in args]
    names = tuple(
        arg.text("name") if isinstance(arg, Node) and arg.kind == "NAMEDARGEXPR" else None
        for arg in args
    )
    types = tuple(_written_type(arg, array_of) for arg in args)
    return Call("function", node.number(field_name), types, names, expr_type(node, array_of))


# -- shadows -----------------------------------------------------------------------------------------
# For every pg_catalog function ($1 names) and operator ($2 symbols) of those names whose
# argument types are concrete: the signatures that reach it only through a conversion, where
# pg_catalog has no function or operator of that name with exactly those types. A position
# may take what converts to its declared type implicitly (pg_cast context 'i', binary
# coercions included; for an array, an array of what converts to its element), and what an
# unknown-typed literal or parameter resolves to first: text (the string category wins
# for an unknown input), or the preferred type of the declared type's category. Only types
# the product's statements use ($3) are tried. Operators and functions of up to two arguments:
# every combination; longer functions: every signature that differs in one position (a call
# that needs a conversion anywhere then has a candidate with more exact arguments than
# pg_catalog's own). Polymorphic and variadic candidates are left to the call sites.
CATALOG_SHADOWS = """
WITH RECURSIVE
used AS (SELECT pg_catalog.unnest($3::oid[]) AS oid),
passes AS (
    SELECT s.target, s.source FROM (
        SELECT c.casttarget AS target, c.castsource AS source
        FROM pg_catalog.pg_cast c WHERE c.castcontext OPERATOR(pg_catalog.=) 'i'
        UNION
        SELECT ta.oid, sa.oid
        FROM pg_catalog.pg_type ta
        JOIN pg_catalog.pg_cast c ON c.casttarget OPERATOR(pg_catalog.=) ta.typelem
        JOIN pg_catalog.pg_type s ON s.oid OPERATOR(pg_catalog.=) c.castsource
        JOIN pg_catalog.pg_type sa ON sa.oid OPERATOR(pg_catalog.=) s.typarray
        WHERE ta.typcategory OPERATOR(pg_catalog.=) 'A'
          AND c.castcontext OPERATOR(pg_catalog.=) 'i'
        UNION
        SELECT t.oid, 'pg_catalog.text'::pg_catalog.regtype::oid FROM pg_catalog.pg_type t
        UNION
        SELECT t.oid, p.oid FROM pg_catalog.pg_type t
        JOIN pg_catalog.pg_type p ON p.typcategory OPERATOR(pg_catalog.=) t.typcategory
        WHERE p.typispreferred
    ) s
    WHERE s.source IN (SELECT oid FROM used) AND s.source OPERATOR(pg_catalog.<>) s.target
),
declared AS (
    SELECT p.oid, p.proname, p.pronargs,
           pg_catalog.string_to_array(p.proargtypes::text, ' ')::oid[] AS args
    FROM pg_catalog.pg_proc p
    WHERE p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
      AND p.proname OPERATOR(pg_catalog.=) ANY ($1::name[])
      AND p.prokind IN ('f', 'a')
      AND p.provariadic OPERATOR(pg_catalog.=) 0
      AND NOT EXISTS (
          SELECT 1 FROM pg_catalog.unnest(p.proargtypes) AS a(t)
          JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.t
          WHERE t.typtype OPERATOR(pg_catalog.=) 'p')
),
combined (oid, position, args, changed) AS (
    SELECT d.oid, 0, ARRAY[]::oid[], 0 FROM declared d
    UNION ALL
    SELECT k.oid, k.position OPERATOR(pg_catalog.+) 1,
           k.args OPERATOR(pg_catalog.||) s.type,
           k.changed OPERATOR(pg_catalog.+) s.changed
    FROM combined k
    JOIN declared d ON d.oid OPERATOR(pg_catalog.=) k.oid
    CROSS JOIN LATERAL (
        SELECT d.args[k.position OPERATOR(pg_catalog.+) 1] AS type, 0 AS changed
        UNION ALL
        SELECT p.source, 1 FROM passes p
        WHERE p.target OPERATOR(pg_catalog.=) d.args[k.position OPERATOR(pg_catalog.+) 1]
    ) s
    WHERE k.position OPERATOR(pg_catalog.<) d.pronargs
      AND (d.pronargs OPERATOR(pg_catalog.<=) 2 OR k.changed OPERATOR(pg_catalog.+) s.changed
                                                   OPERATOR(pg_catalog.<=) 1)
)
-- Of the candidates a signature imitates, the one it differs from in fewest positions.
(SELECT DISTINCT ON (d.proname, k.args) 'function' AS kind, d.oid AS imitates,
        k.args AS arg_types
 FROM combined k
 JOIN declared d ON d.oid OPERATOR(pg_catalog.=) k.oid
 WHERE k.position OPERATOR(pg_catalog.=) d.pronargs AND k.changed OPERATOR(pg_catalog.>) 0
   AND NOT EXISTS (
       SELECT 1 FROM pg_catalog.pg_proc p
       WHERE p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
         AND p.proname OPERATOR(pg_catalog.=) d.proname
         AND pg_catalog.string_to_array(p.proargtypes::text, ' ')::oid[]
             OPERATOR(pg_catalog.=) k.args)
 ORDER BY d.proname, k.args, k.changed, d.oid)
UNION ALL
(SELECT DISTINCT ON (o.oprname, l.type, r.type) 'operator', o.oid, ARRAY[l.type, r.type]
FROM pg_catalog.pg_operator o
CROSS JOIN LATERAL (
    SELECT o.oprleft AS type UNION SELECT p.source FROM passes p
    WHERE p.target OPERATOR(pg_catalog.=) o.oprleft) l
CROSS JOIN LATERAL (
    SELECT o.oprright AS type UNION SELECT p.source FROM passes p
    WHERE p.target OPERATOR(pg_catalog.=) o.oprright) r
WHERE o.oprnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
  AND o.oprname OPERATOR(pg_catalog.=) ANY ($2::name[])
  AND o.oprleft OPERATOR(pg_catalog.<>) 0
  AND NOT EXISTS (
      SELECT 1 FROM pg_catalog.pg_type t
      WHERE t.oid IN (o.oprleft, o.oprright) AND t.typtype OPERATOR(pg_catalog.=) 'p')
  AND NOT EXISTS (
      SELECT 1 FROM pg_catalog.pg_operator x
      WHERE x.oprnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
        AND x.oprname OPERATOR(pg_catalog.=) o.oprname
        AND x.oprleft OPERATOR(pg_catalog.=) l.type
        AND x.oprright OPERATOR(pg_catalog.=) r.type)
ORDER BY o.oprname, l.type, r.type,
         (l.type OPERATOR(pg_catalog.<>) o.oprleft)::integer
         OPERATOR(pg_catalog.+) (r.type OPERATOR(pg_catalog.<>) o.oprright)::integer,
         o.oid)
"""

# What a shadow copies from the pg_catalog function or operator it imitates.
_CALLEES = """
SELECT p.oid, 'function' AS kind, p.proname::text AS name, p.prokind::text AS prokind,
       pg_catalog.string_to_array(p.proargtypes::text, ' ')::oid[] AS arg_types,
       p.proargnames AS arg_names, p.proargmodes::text[] AS arg_modes,
       p.proallargtypes AS all_arg_types, p.pronargdefaults AS defaults,
       p.prorettype AS result_type, p.proretset AS returns_set,
       EXISTS (SELECT 1 FROM pg_catalog.pg_type t
               WHERE t.oid OPERATOR(pg_catalog.=) p.prorettype
                 AND t.typtype OPERATOR(pg_catalog.=) 'p'
                 AND t.oid OPERATOR(pg_catalog.<>) 'pg_catalog.void'::pg_catalog.regtype
                 AND t.oid OPERATOR(pg_catalog.<>) 'pg_catalog.record'::pg_catalog.regtype)
           AS polymorphic_result,
       p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace AS catalog
FROM pg_catalog.pg_proc p WHERE p.oid OPERATOR(pg_catalog.=) ANY ($1::oid[])
UNION ALL
SELECT o.oid, 'operator', o.oprname::text, NULL,
       ARRAY[o.oprleft, o.oprright], NULL, NULL, NULL, 0, o.oprresult, false, false,
       o.oprnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
FROM pg_catalog.pg_operator o WHERE o.oid OPERATOR(pg_catalog.=) ANY ($2::oid[])
"""

_EXACT_IN_CATALOG = """
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_proc p
    WHERE $1 OPERATOR(pg_catalog.=) 'function'
      AND p.pronamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
      AND p.proname OPERATOR(pg_catalog.=) $2::name
      AND pg_catalog.string_to_array(p.proargtypes::text, ' ')::oid[] OPERATOR(pg_catalog.=) $3
    UNION ALL
    SELECT 1 FROM pg_catalog.pg_operator o
    WHERE $1 OPERATOR(pg_catalog.=) 'operator'
      AND o.oprnamespace OPERATOR(pg_catalog.=) 'pg_catalog'::pg_catalog.regnamespace
      AND o.oprname OPERATOR(pg_catalog.=) $2::name
      AND o.oprleft OPERATOR(pg_catalog.=) $3[1] AND o.oprright OPERATOR(pg_catalog.=) $3[2])
"""

_TYPE_NAMES = """
SELECT t.oid, pg_catalog.format_type(t.oid, NULL), t.typarray, t.typelem, t.typtype::text
FROM pg_catalog.pg_type t
"""

# Every shadow in the schema, by OID (operators also by their function's), as a signature.
_SHADOWS = """
SELECT p.oid, CASE p.prokind WHEN 'a' THEN 'aggregate ' ELSE '' END
              OPERATOR(pg_catalog.||) p.proname OPERATOR(pg_catalog.||) '('
              OPERATOR(pg_catalog.||) pg_catalog.pg_get_function_identity_arguments(p.oid)
              OPERATOR(pg_catalog.||) ')'
FROM pg_catalog.pg_proc p
WHERE p.pronamespace OPERATOR(pg_catalog.=) $1::pg_catalog.regnamespace
UNION ALL
SELECT x.oid, label FROM (
    SELECT o.oid AS operator, o.oprcode::oid AS function,
           'operator ' OPERATOR(pg_catalog.||) o.oprname OPERATOR(pg_catalog.||) ' ('
           OPERATOR(pg_catalog.||) pg_catalog.format_type(o.oprleft, NULL)
           OPERATOR(pg_catalog.||) ', '
           OPERATOR(pg_catalog.||) pg_catalog.format_type(o.oprright, NULL)
           OPERATOR(pg_catalog.||) ')' AS label
    FROM pg_catalog.pg_operator o
    WHERE o.oprnamespace OPERATOR(pg_catalog.=) $1::pg_catalog.regnamespace
) s CROSS JOIN LATERAL (VALUES (s.operator), (s.function)) AS x(oid)
"""


@dataclass
class Catalog:
    """The server's types: names, arrays and elements."""

    names: dict[int, str]
    array_of: dict[int, int]
    element_of: dict[int, int]
    pseudo: frozenset[int]

    @classmethod
    async def read(cls, conn: asyncpg.Connection) -> Catalog:
        rows = await conn.fetch(_TYPE_NAMES)
        return cls(
            names={r[0]: r[1] for r in rows},
            array_of={r[0]: r[2] for r in rows if r[2]},
            element_of={r[0]: r[3] for r in rows if r[3]},
            pseudo=frozenset(r[0] for r in rows if r[4] == "p"),
        )


@dataclass(frozen=True)
class Shadow:
    """One planted object: its name, kind, parameters and result, and why it is there."""

    kind: str  # "function", "aggregate" or "operator"
    name: str
    args: tuple[tuple[str | None, int, bool], ...]  # (name, type, has a default)
    outs: tuple[tuple[str, int], ...] = ()
    result: int = 0
    returns_set: bool = False
    source: str = "catalog"  # "catalog" or "call"

    @property
    def key(self) -> tuple[str, str, tuple[int, ...]]:
        kind = "operator" if self.kind == "operator" else "function"
        return (kind, self.name, tuple(t for _, t, _ in self.args))


@dataclass
class Planted:
    """What :func:`plant_shadows` created, and a label for each of its OIDs."""

    shadows: list[Shadow] = field(default_factory=list)
    labels: dict[int, str] = field(default_factory=dict)

    def summary(self, catalog: Catalog) -> list[str]:
        """One line per name or symbol: how many shadows, from where; then every shadow
        planted for a call of the statements, in full."""
        by_name: dict[tuple[str, str], list[Shadow]] = {}
        for shadow in self.shadows:
            by_name.setdefault((shadow.kind, shadow.name), []).append(shadow)
        lines = [
            f"{kind} {name}: {len(items)} ("
            f"{sum(s.source == 'catalog' for s in items)} from the catalog, "
            f"{sum(s.source == 'call' for s in items)} from the calls)"
            for (kind, name), items in sorted(by_name.items())
        ]
        lines += [
            f"  for a call: {_signature(s, catalog)}"
            for s in sorted(self.shadows, key=lambda s: _signature(s, catalog))
            if s.source == "call"
        ]
        return lines


def _signature(shadow: Shadow, catalog: Catalog) -> str:
    args = ", ".join(
        (f"{name} => " if name else "") + catalog.names[type_]
        for name, type_, _ in shadow.args
        if type_
    )
    return f"{shadow.kind} {shadow.name}({args})"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _shadow_ddl(shadow: Shadow, number: int, catalog: Catalog, volatility: str) -> list[str]:
    schema = SHADOW_SCHEMA
    types = catalog.names
    label = _signature(shadow, catalog).replace("'", "''")
    body = (
        f"{volatility} LANGUAGE plpgsql AS $shadow$ BEGIN RAISE EXCEPTION "
        f"'exact-calls shadow % called by %', '{label}', current_user; END $shadow$"
    )
    ins = [
        (f"{_quote(name)} " if name else "") + types[type_] + (" DEFAULT NULL" if default else "")
        for name, type_, default in shadow.args
    ]
    outs = [f"OUT {_quote(name)} {types[type_]}" for name, type_ in shadow.outs]
    returns = ("SETOF " if shadow.returns_set else "") + (
        "record" if shadow.outs else types[shadow.result]
    )
    if shadow.kind == "operator":
        function = f"{schema}.exact_shadow_operator_{number}"
        left, right = (t for _, t, _ in shadow.args)
        params = [types[t] for t in (left, right) if t]
        sides = ([f"LEFTARG = {types[left]}"] if left else []) + [f"RIGHTARG = {types[right]}"]
        return [
            f"CREATE FUNCTION {function}({', '.join(params)}) "
            f"RETURNS {types[shadow.result]} {body}",
            f"CREATE OPERATOR {schema}.{shadow.name} ({', '.join(sides)}, FUNCTION = {function})",
        ]
    if shadow.kind == "aggregate":
        step = f"{schema}.exact_shadow_step_{number}"
        state = types[shadow.result]
        plain = [types[t] for _, t, _ in shadow.args]
        return [
            f"CREATE FUNCTION {step}({', '.join([state, *plain])}) RETURNS {state} {body}",
            f"CREATE AGGREGATE {schema}.{_quote(shadow.name)}({', '.join(plain)}) "
            f"(SFUNC = {step}, STYPE = {state})",
        ]
    return [
        f"CREATE FUNCTION {schema}.{_quote(shadow.name)}({', '.join([*ins, *outs])}) "
        f"RETURNS {returns} {body}"
    ]


def _imitating(callee: asyncpg.Record, arg_types: Sequence[int]) -> Shadow:
    """A shadow of the pg_catalog ``callee`` with ``arg_types``: its parameter names,
    defaults where it has them, its OUT parameters and its result."""
    count = len(callee["arg_types"])
    names = list(callee["arg_names"] or [])
    modes = list(callee["arg_modes"] or [])
    in_names = [
        n for n, m in zip(names, modes or ["i"] * len(names), strict=False) if m in ("i", "b", "v")
    ]
    in_names += [""] * (count - len(in_names))
    first_default = count - callee["defaults"]
    args = tuple((in_names[i] or None, arg_types[i], i >= first_default) for i in range(count))
    outs: tuple[tuple[str, int], ...] = ()
    if callee["all_arg_types"] is not None:
        outs = tuple(
            (names[i], callee["all_arg_types"][i])
            for i, mode in enumerate(modes)
            if mode in ("o", "t")
        )
    kind = callee["kind"]
    if kind == "function" and callee["prokind"] == "a":
        kind = "aggregate"
    return Shadow(
        kind,
        callee["name"],
        args,
        outs,
        callee["result_type"],
        callee["returns_set"],
    )


async def plant_shadows(
    conn: asyncpg.Connection, trees: Iterable[Any], catalog: Catalog, *, immutable: bool = False
) -> Planted:
    """Create :data:`SHADOW_SCHEMA` and in it the shadows for the calls of ``trees`` (parse
    trees read without the shadows, in this database or one with the same pg_catalog);
    ``conn`` needs CREATE on the database. ``immutable``: declared so, as one planted for an
    index expression must be (a shadow is never run here: only resolved)."""
    trees = list(trees)
    calls = [
        call
        for tree in trees
        for call in calls_in(tree, catalog.array_of, catalog.element_of)
        if all(t in catalog.names for t in call.arg_types if t)
    ]
    used_types = sorted(
        set().union(*(type_oids(t) for t in trees)) & catalog.names.keys() - catalog.pseudo
    )
    callees = {
        row["oid"]: row
        for row in await conn.fetch(
            _CALLEES,
            sorted({c.callee for c in calls if c.kind == "function"}),
            sorted({c.callee for c in calls if c.kind == "operator"}),
        )
    }
    named = [(c.kind, callees[c.callee]) for c in calls if c.callee in callees]
    names = sorted({callee["name"] for kind, callee in named if kind == "function"})
    symbols = sorted({callee["name"] for kind, callee in named if kind == "operator"})

    shadows: dict[tuple[str, str, tuple[int, ...]], Shadow] = {}
    rows = await conn.fetch(CATALOG_SHADOWS, names, symbols, used_types)
    imitated = {
        row["oid"]: row
        for row in await conn.fetch(
            _CALLEES,
            sorted({r["imitates"] for r in rows if r["kind"] == "function"}),
            sorted({r["imitates"] for r in rows if r["kind"] == "operator"}),
        )
    }
    for row in rows:
        shadow = _imitating(imitated[row["imitates"]], row["arg_types"])
        shadows.setdefault(shadow.key, shadow)
    # The exact types of every call, where pg_catalog lacks them (polymorphic and variadic
    # callees above all, which the catalog cannot enumerate).
    for call in calls:
        callee = callees.get(call.callee)
        if callee is None or not callee["catalog"] or not call.arg_types:
            continue  # a call of the product's own functions; or one with no arguments
        shadow = _for_call(call, callee)
        if shadow.key in shadows:
            continue
        if await conn.fetchval(_EXACT_IN_CATALOG, shadow.key[0], shadow.name, list(shadow.key[2])):
            continue
        shadows[shadow.key] = shadow

    ddl = [f"CREATE SCHEMA {SHADOW_SCHEMA}"]
    volatility = "IMMUTABLE" if immutable else "VOLATILE"
    for number, shadow in enumerate(shadows.values()):
        ddl += _shadow_ddl(shadow, number, catalog, volatility)
    async with conn.transaction():
        for start in range(0, len(ddl), 500):
            await conn.execute(";\n".join(ddl[start : start + 500]))
    labels = {row[0]: row[1] for row in await conn.fetch(_SHADOWS, SHADOW_SCHEMA)}
    return Planted(list(shadows.values()), labels)


def _for_call(call: Call, callee: asyncpg.Record) -> Shadow:
    if call.kind == "operator":
        return Shadow(
            "operator",
            callee["name"],
            tuple((None, t, False) for t in call.arg_types),
            result=callee["result_type"],
            source="call",
        )
    kind = "aggregate" if callee["prokind"] == "a" else "function"
    # Positional arguments need no name; a named one must carry it.
    args = tuple(
        (name, type_, False) for name, type_ in zip(call.arg_names, call.arg_types, strict=True)
    )
    polymorphic = callee["polymorphic_result"]
    shadow = Shadow(
        kind,
        callee["name"],
        args,
        result=call.result_type if polymorphic else callee["result_type"],
        returns_set=callee["returns_set"],
        source="call",
    )
    if not polymorphic and callee["all_arg_types"] is not None:
        outs = _imitating(callee, list(callee["arg_types"])).outs
        shadow = Shadow(kind, shadow.name, args, outs, shadow.result, shadow.returns_set, "call")
    return shadow


# The expressions the migrated schema ($1) stores, as node trees: column defaults, index
# expressions and predicates, check constraints, trigger conditions, SQL-standard function
# bodies. Each was resolved when its migration ran, on the migrating session's path.
STORED_EXPRESSIONS = """
SELECT pg_catalog.pg_describe_object('pg_catalog.pg_attrdef'::pg_catalog.regclass, d.oid, 0),
       d.adbin::text
FROM pg_catalog.pg_attrdef d
JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.adrelid
WHERE c.relnamespace OPERATOR(pg_catalog.=) $1::pg_catalog.regnamespace
UNION ALL
SELECT pg_catalog.pg_describe_object('pg_catalog.pg_class'::pg_catalog.regclass, i.indexrelid, 0),
       e.tree
FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) i.indexrelid
CROSS JOIN LATERAL (VALUES (i.indexprs::text), (i.indpred::text)) AS e(tree)
WHERE c.relnamespace OPERATOR(pg_catalog.=) $1::pg_catalog.regnamespace AND e.tree IS NOT NULL
UNION ALL
SELECT pg_catalog.pg_describe_object('pg_catalog.pg_constraint'::pg_catalog.regclass, k.oid, 0),
       k.conbin::text
FROM pg_catalog.pg_constraint k
WHERE k.connamespace OPERATOR(pg_catalog.=) $1::pg_catalog.regnamespace AND k.conbin IS NOT NULL
UNION ALL
SELECT pg_catalog.pg_describe_object('pg_catalog.pg_trigger'::pg_catalog.regclass, t.oid, 0),
       t.tgqual::text
FROM pg_catalog.pg_trigger t
JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid
WHERE c.relnamespace OPERATOR(pg_catalog.=) $1::pg_catalog.regnamespace AND t.tgqual IS NOT NULL
UNION ALL
SELECT pg_catalog.pg_describe_object('pg_catalog.pg_proc'::pg_catalog.regclass, p.oid, 0),
       p.prosqlbody::text
FROM pg_catalog.pg_proc p
WHERE p.pronamespace OPERATOR(pg_catalog.=) $1::pg_catalog.regnamespace
  AND p.prosqlbody IS NOT NULL
"""

# The objects that depend on a shadow ($1: every shadow's OID), each with the shadow's OID.
BOUND_TO = """
SELECT pg_catalog.pg_describe_object(d.classid, d.objid, d.objsubid), d.refobjid
FROM pg_catalog.pg_depend d
WHERE d.refobjid OPERATOR(pg_catalog.=) ANY ($1::oid[])
  AND NOT d.objid OPERATOR(pg_catalog.=) ANY ($1::oid[])  -- a shadow's own parts
ORDER BY 1
"""


def shadow_hits(tree: Any, planted: Planted) -> list[str]:
    """The shadows ``tree`` resolved to, as signatures."""
    return sorted({planted.labels[oid] for oid in resolved_oids(tree) if oid in planted.labels})


__all__ = [
    "BOUND_TO",
    "CATALOG_SHADOWS",
    "PACKAGES",
    "SHADOW_SCHEMA",
    "STORED_EXPRESSIONS",
    "Call",
    "Catalog",
    "Literal",
    "ParseTrees",
    "Planted",
    "Shadow",
    "UnknownNode",
    "calls_in",
    "covered_by",
    "looks_like_sql",
    "pieces",
    "plant_shadows",
    "product_sql",
    "shadow_hits",
    "source_literals",
]
