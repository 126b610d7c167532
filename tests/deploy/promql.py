"""An evaluator of the few PromQL forms the monitoring kit uses, over real scrapes.

Instant vectors come from the last of two scrapes per target; ``rate``/``increase`` over any
range read the change between the two. Aggregations (``sum``, ``max``, ``min``, ``count``
with ``by``/``without``), comparisons and arithmetic against a number, ``time()``,
``absent`` and ``histogram_quantile`` are what the rules and panels need; any other form is
refused, so a new rule the evaluator cannot judge fails loudly instead of passing. Alerts
are judged as if their condition had held for their ``for:`` (the scrapes hold it steady).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import promql_parser as pq
from prometheus_client.parser import text_string_to_metric_families

Labels = frozenset[tuple[str, str]]
Vector = list[tuple[Labels, float]]


class Unsupported(ValueError):
    """A PromQL form this evaluator does not know."""


@dataclass(frozen=True)
class Target:
    """One scraped process: its target labels and two scrapes ``seconds`` apart."""

    labels: Mapping[str, str]
    first: str
    last: str


def _series(text: str, target: Mapping[str, str]) -> dict[Labels, float]:
    series: dict[Labels, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {**sample.labels, **target, "__name__": sample.name}
            series[frozenset(labels.items())] = sample.value
    return series


class Evaluator:
    """Evaluates expressions at the time of the last scrape."""

    def __init__(self, targets: Iterable[Target], *, seconds: float, now: float) -> None:
        self.seconds = seconds
        self.now = now
        self.first: dict[Labels, float] = {}
        self.last: dict[Labels, float] = {}
        for target in targets:
            self.first.update(_series(target.first, target.labels))
            self.last.update(_series(target.last, target.labels))
            up = frozenset({**target.labels, "__name__": "up"}.items())
            self.first[up] = self.last[up] = 1.0

    def __call__(self, expr: str) -> Vector | float:
        """The value of ``expr``: an instant vector or a number."""
        return self._eval(pq.parse(expr))

    def _eval(self, node: Any) -> Vector | float:
        handlers: dict[type, Callable[[Any], Vector | float]] = {
            pq.NumberLiteral: lambda n: float(n.val),
            pq.ParenExpr: lambda n: self._eval(n.expr),
            pq.VectorSelector: lambda n: self._select(n, self.last),
            pq.AggregateExpr: self._aggregate,
            pq.BinaryExpr: self._binary,
            pq.Call: self._call,
        }
        handler = handlers.get(type(node))
        if handler is None:
            raise Unsupported(f"{type(node).__name__}: {node}")
        return handler(node)

    @staticmethod
    def _matches(labels: dict[str, str], node: Any) -> bool:
        if node.name and labels.get("__name__") != node.name:
            return False
        for matcher in node.matchers.matchers:
            value = labels.get(matcher.name, "")
            op = str(matcher.op).rsplit(".", 1)[-1]
            if op == "Equal":
                ok = value == matcher.value
            elif op == "NotEqual":
                ok = value != matcher.value
            elif op in ("Re", "NotRe"):
                ok = bool(re.fullmatch(matcher.value, value)) == (op == "Re")
            else:
                raise Unsupported(f"matcher {matcher.op}")
            if not ok:
                return False
        if node.matchers.or_matchers or node.offset or node.at:
            raise Unsupported(str(node))
        return True

    def _select(self, node: Any, series: dict[Labels, float]) -> Vector:
        return [(labels, v) for labels, v in series.items() if self._matches(dict(labels), node)]

    def _aggregate(self, node: Any) -> Vector:
        inner = self._vector(self._eval(node.expr))
        op = str(node.op)
        if node.param is not None or op not in ("sum", "max", "min", "count"):
            raise Unsupported(f"aggregation {op}")
        modifier = node.modifier
        groups: dict[Labels, list[float]] = {}
        for labels, value in inner:
            named = dict(labels)
            named.pop("__name__", None)
            if modifier is None:
                key: dict[str, str] = {}
            elif str(modifier.type).endswith("By"):
                key = {k: v for k, v in named.items() if k in modifier.labels}
            else:
                key = {k: v for k, v in named.items() if k not in modifier.labels}
            groups.setdefault(frozenset(key.items()), []).append(value)
        combine: dict[str, Callable[[list[float]], float]] = {
            "sum": math.fsum,
            "max": max,
            "min": min,
            "count": lambda values: float(len(values)),
        }
        return [(key, combine[op](values)) for key, values in groups.items()]

    def _binary(self, node: Any) -> Vector | float:
        lhs, rhs = self._eval(node.lhs), self._eval(node.rhs)
        op = str(node.op)
        arithmetic: dict[str, Callable[[float, float], float]] = {
            "+": lambda a, b: a + b,
            "-": lambda a, b: a - b,
            "*": lambda a, b: a * b,
            "/": lambda a, b: a / b if b else math.nan,
        }
        compare: dict[str, Callable[[float, float], bool]] = {
            "==": lambda a, b: a == b,
            "!=": lambda a, b: a != b,
            ">": lambda a, b: a > b,
            "<": lambda a, b: a < b,
            ">=": lambda a, b: a >= b,
            "<=": lambda a, b: a <= b,
        }
        if isinstance(lhs, list) and isinstance(rhs, list):
            raise Unsupported("vector-to-vector matching")
        if node.modifier is not None and node.modifier.return_bool:
            raise Unsupported("bool comparisons")
        if isinstance(lhs, float) and isinstance(rhs, float):
            if op in arithmetic:
                return arithmetic[op](lhs, rhs)
            raise Unsupported(f"scalar {op}")
        vector, number, vector_left = (
            (lhs, rhs, True) if isinstance(lhs, list) else (rhs, lhs, False)
        )
        assert isinstance(vector, list) and isinstance(number, float)
        out: Vector = []
        for labels, value in vector:
            a, b = (value, number) if vector_left else (number, value)
            if op in compare:
                if compare[op](a, b):
                    out.append((labels, value))
            elif op in arithmetic:
                out.append((_drop_name(labels), arithmetic[op](a, b)))
            else:
                raise Unsupported(f"operator {op}")
        return out

    def _call(self, node: Any) -> Vector | float:
        name = node.func.name
        if name == "time" and not node.args:
            return self.now
        if name == "absent":
            return [] if self._vector(self._eval(node.args[0])) else [(frozenset(), 1.0)]
        if name in ("rate", "increase"):
            (matrix,) = node.args
            if not isinstance(matrix, pq.MatrixSelector):
                raise Unsupported(f"{name} of {matrix}")
            selector = matrix.vector_selector
            before = dict(self._select(selector, self.first))
            out: Vector = []
            for labels, value in self._select(selector, self.last):
                earlier = before.get(labels, 0.0)
                grown = value - earlier if value >= earlier else value  # a reset
                out.append((_drop_name(labels), grown / self.seconds if name == "rate" else grown))
            return out
        if name == "histogram_quantile":
            quantile = self._eval(node.args[0])
            assert isinstance(quantile, float)
            return _histogram_quantile(quantile, self._vector(self._eval(node.args[1])))
        raise Unsupported(f"function {name}")

    @staticmethod
    def _vector(value: Vector | float) -> Vector:
        if not isinstance(value, list):
            raise Unsupported("a number where a vector belongs")
        return value


def _drop_name(labels: Labels) -> Labels:
    return frozenset((k, v) for k, v in labels if k != "__name__")


def _histogram_quantile(q: float, buckets: Vector) -> Vector:
    """Prometheus's rule: linear interpolation inside the bucket the rank falls in."""
    groups: dict[Labels, list[tuple[float, float]]] = {}
    for labels, count in buckets:
        named = dict(labels)
        bound = float(named.pop("le"))
        named.pop("__name__", None)
        groups.setdefault(frozenset(named.items()), []).append((bound, count))
    out: Vector = []
    for key, pairs in groups.items():
        pairs.sort()
        total = pairs[-1][1]
        if total == 0:
            out.append((key, math.nan))
            continue
        rank = q * total
        lower_bound, lower_count = 0.0, 0.0
        for bound, count in pairs:
            if count >= rank:
                if math.isinf(bound):
                    value = lower_bound
                else:
                    value = lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                        count - lower_count or 1.0
                    )
                out.append((key, value))
                break
            lower_bound, lower_count = bound, count
    return out


def firing(rules: Iterable[Mapping[str, Any]], evaluate: Evaluator) -> list[tuple[str, Labels]]:
    """Every (alert, labels) the rules would raise now."""
    alerts = []
    for rule in rules:
        result = evaluate(rule["expr"])
        assert isinstance(result, list), rule["alert"]
        alerts.extend((rule["alert"], labels) for labels, _ in result)
    return alerts
