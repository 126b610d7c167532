"""The kit's PromQL evaluator (tests/deploy/promql.py) gives Prometheus's answers on the forms
the rules and panels use, and refuses the forms it does not know."""

from __future__ import annotations

import pytest

from tests.deploy.promql import Evaluator, Target, Unsupported

FIRST = """# TYPE c counter
c_total{kind="a"} 1
c_total{kind="b"} 5
# TYPE g gauge
g 3
# TYPE h histogram
h_bucket{le="0.1"} 0
h_bucket{le="1.0"} 0
h_bucket{le="+Inf"} 0
h_sum 0
h_count 0
"""
LAST = """# TYPE c counter
c_total{kind="a"} 4
c_total{kind="b"} 2
# TYPE g gauge
g 7
# TYPE h histogram
h_bucket{le="0.1"} 5
h_bucket{le="1.0"} 10
h_bucket{le="+Inf"} 10
h_sum 3
h_count 10
"""


@pytest.fixture
def evaluate() -> Evaluator:
    targets = [
        Target({"job": "j", "instance": "one"}, FIRST, LAST),
        Target({"job": "j", "instance": "two"}, FIRST, FIRST),
    ]
    return Evaluator(targets, seconds=10.0, now=1000.0)


def values(result: object) -> list[float]:
    assert isinstance(result, list)
    return sorted(v for _, v in result)


def test_aggregations_comparisons_and_time(evaluate: Evaluator) -> None:
    assert values(evaluate("max by (job) (g)")) == [7.0]
    assert values(evaluate("sum(g)")) == [10.0]
    assert values(evaluate('g{instance=~"t.*"} > 2')) == [3.0]
    assert values(evaluate("g > 5")) == [7.0]
    assert values(evaluate("count without (instance) (g)")) == [2.0]
    assert values(evaluate("time() - g")) == [993.0, 997.0]
    assert values(evaluate('up{job="j"} == 1')) == [1.0, 1.0]


def test_rates_increases_resets_and_absence(evaluate: Evaluator) -> None:
    # a grew by 3; b fell from 5 to 2, a counter reset, so it grew by 2.
    assert values(evaluate('sum by (kind) (increase(c_total{instance="one"}[5m]))')) == [2.0, 3.0]
    assert values(evaluate('rate(c_total{kind="a", instance="one"}[1m])')) == [0.3]
    assert values(evaluate("absent(g)")) == []
    assert values(evaluate('absent(g{job="other"})')) == [1.0]


def test_histogram_quantile_interpolates_in_the_bucket(evaluate: Evaluator) -> None:
    q = 'histogram_quantile(0.5, sum by (le) (rate(h_bucket{instance="one"}[5m])))'
    assert values(evaluate(q)) == [pytest.approx(0.1)]
    q = 'histogram_quantile(0.75, sum by (le) (rate(h_bucket{instance="one"}[5m])))'
    assert values(evaluate(q)) == [pytest.approx(0.55)]


@pytest.mark.parametrize(
    "expr", ["g == bool 1", "g / on (job) g", "topk(1, g)", "avg_over_time(g[5m])", "g offset 5m"]
)
def test_forms_it_does_not_know_are_refused(evaluate: Evaluator, expr: str) -> None:
    with pytest.raises(Unsupported):
        evaluate(expr)
