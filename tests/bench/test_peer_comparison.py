"""The peer comparison's pure decisions: verdicts, ratios within a run, percentiles, settings."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from bench.peers import debezium, measure
from bench.peers.comparison import (
    DRAIN_PAIR,
    LATENCY_PAIR,
    LATENCY_SYSTEMS,
    SYSTEMS,
    Scale,
    run_order,
)
from bench.peers.measure import latencies_ms, percentile
from bench.report import costs, files, plot, printed
from bench.report.costs import rss_line
from bench.report.judging import median_or_none, per_run_ratios, verdict
from bench.report.main import main
from tests.support.services import REQUIRED
from tests.support.waiting import wait_until


@pytest.mark.parametrize(
    ("value", "compare", "bound", "expected"),
    [
        (1.2, "<=", 1.2, "PASS"),
        (1.21, "<=", 1.2, "FAIL"),
        (0.9, ">=", 0.9, "PASS"),
        (0.89, ">=", 0.9, "FAIL"),
        (0.24, "", 0.0, "info"),
        (None, "<=", 1.2, "n/a"),
    ],
)
def test_verdict(value: float | None, compare: str, bound: float, expected: str) -> None:
    assert verdict(value, compare, bound) == expected


def _row(run: int, system: str, phase: str, **figures: float) -> dict[str, object]:
    return {"run": run, "system": system, "phase": phase, **figures}


def test_ratios_are_taken_within_one_run() -> None:
    rows = [
        _row(1, "relay", "drain", rate=30_000),
        _row(1, "raw-send", "drain", rate=40_000),
        _row(1, "raw-send_batch", "drain", rate=120_000),
        _row(1, "debezium-poll1ms", "drain", rate=6_000),
        _row(1, "debezium-poll10ms", "drain", rate=7_500),
        _row(1, "relay", "latency", p50=4.0, p99=20.0),
        _row(1, "debezium-poll1ms", "latency", p50=2.0, p99=10.0),
        _row(1, "debezium-poll10ms", "latency", p50=8.0, p99=40.0),
        # Another run's figures never enter run 1's ratios.
        _row(2, "raw-send", "drain", rate=1),
    ]
    ratios = per_run_ratios(rows, 1)
    assert ratios["drain_vs_send"] == pytest.approx(0.75)
    assert ratios["drain_vs_send_batch"] == pytest.approx(0.25)
    # Judged against the faster Debezium of the run.
    assert ratios["drain_vs_debezium"] == pytest.approx(4.0)
    assert ratios["p50_vs_debezium"] == pytest.approx(2.0)
    assert ratios["p99_vs_debezium10"] == pytest.approx(0.5)
    assert per_run_ratios(rows, 2)["drain_vs_send"] is None


@pytest.mark.parametrize(
    ("values", "expected"), [([1.0, None, 3.0], 2.0), ([None], None), ([0.7, 0.9, 0.8], 0.8)]
)
def test_median_ignores_missing_runs(values: list[float | None], expected: float | None) -> None:
    assert median_or_none(values) == expected


@pytest.mark.parametrize(
    ("events", "peak", "mark"),
    [(1_000_000, 58.0, "PASS"), (1_000_000, 151.0, "FAIL"), (200_000, 400.0, "info")],
)
def test_rss_is_judged_only_on_the_targets_backlog(events: int, peak: float, mark: str) -> None:
    rows = [_row(1, "relay", "drain", peak_rss_mb=peak)]
    assert rss_line(rows, events)[0] == mark


@pytest.mark.parametrize(
    ("pct", "expected"), [(50, 50.0), (99, 99.0), (99.9, 100.0), (100, 100.0), (1, 1.0)]
)
def test_percentile_is_nearest_rank(pct: float, expected: float) -> None:
    assert percentile([float(v) for v in range(1, 101)], pct) == expected


def test_latency_counts_only_events_both_sides_know() -> None:
    sent = {"a": 1.000, "b": 2.000}
    appended = {"a": 1_004, "c": 9_999}
    assert latencies_ms(sent, appended) == [pytest.approx(4.0)]


def test_runs_alternate_which_system_goes_first() -> None:
    firsts = {run_order(SYSTEMS, run, DRAIN_PAIR)[0] for run in range(4)}
    assert firsts == {"relay", "debezium-poll1ms", "debezium-poll10ms", "raw-send_batch"}
    for run in range(6):
        assert sorted(run_order(SYSTEMS, run, DRAIN_PAIR)) == sorted(SYSTEMS)


@pytest.mark.parametrize(
    ("systems", "pair"), [(SYSTEMS, DRAIN_PAIR), (LATENCY_SYSTEMS, LATENCY_PAIR)]
)
def test_a_target_s_two_systems_run_back_to_back_each_first_in_turn(
    systems: tuple[str, ...], pair: tuple[str, str]
) -> None:
    orders = [run_order(systems, run, pair) for run in range(6)]
    for order in orders:
        at = order.index(pair[0])
        assert abs(order.index(pair[1]) - at) == 1, order
    leaders = [min(pair, key=order.index) for order in orders]
    assert leaders == [pair[0], pair[1]] * 3


def test_the_drain_pair_is_sandwiched_each_system_leading_in_turn() -> None:
    relay, raw = DRAIN_PAIR
    for run in range(4):
        order = run_order(SYSTEMS, run, DRAIN_PAIR, sandwich=True)
        at = min(order.index(relay), order.index(raw))
        four = order[at : at + 4]
        lead = (relay, raw) if run % 2 == 0 else (raw, relay)
        assert four == [*lead, *lead[::-1]], order
        assert sorted(order) == sorted([*SYSTEMS, relay, raw])


def test_a_system_measured_twice_in_a_run_is_judged_on_its_mean() -> None:
    rows = [
        _row(1, "relay", "drain", rate=30_000),
        _row(1, "raw-send", "drain", rate=40_000),
        _row(1, "raw-send", "drain", rate=20_000),
        _row(1, "relay", "drain", rate=18_000),
    ]
    # (30,000 + 18,000) / 2 against (40,000 + 20,000) / 2
    assert per_run_ratios(rows, 1)["drain_vs_send"] == pytest.approx(0.8)


def test_a_pair_not_selected_leaves_the_plain_rotation() -> None:
    systems = ("relay", "raw-send_batch")
    assert run_order(systems, 0, DRAIN_PAIR) == ["relay", "raw-send_batch"]
    assert run_order(systems, 1, DRAIN_PAIR) == ["raw-send_batch", "relay"]


def test_scale_counts_the_measurements_of_the_selected_systems() -> None:
    assert Scale(runs=3).measurements() == 3 * (5 + 2 + 4)  # the drain pair twice
    assert Scale(runs=2, systems=("relay", "raw-send_batch")).measurements() == 2 * 3


def test_connector_maps_the_event_router_to_our_outbox_table() -> None:
    db = debezium.peer_database("postgresql://u%40x:p%3Aw@db.local:6543/peer", "outbox_bench_x")
    assert (db.host, db.port, db.user, db.password, db.dbname) == (
        "db.local",
        6543,
        "u@x",
        "p:w",
        "peer",
    )
    props = debezium.connector_properties(db, "ns1", poll_interval_ms=1)
    assert props["plugin.name"] == "pgoutput"
    assert props["publication.name"] == "outbox_bench_x_pub"
    assert props["table.include.list"] == "public.outbox"
    assert props["poll.interval.ms"] == "1"
    assert props["transforms.outbox.table.field.event.key"] == "aggregateid"
    assert props["transforms.outbox.table.field.event.payload"] == "payload"
    assert props["transforms.outbox.route.by.field"] == "aggregatetype"
    assert props["transforms.outbox.route.topic.replacement"] == "ns1.${routedByValue}"


def test_connector_connects_with_the_urls_tls_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every system reads PostgreSQL with the same TLS: the URL's sslmode, else PGSSLMODE,
    # else libpq's (and asyncpg's, and Debezium's) own default, prefer.
    monkeypatch.delenv("PGSSLMODE", raising=False)
    url = "postgresql://u:p@db.local:6543/peer"
    assert debezium.peer_database(url, "s").sslmode == "prefer"
    monkeypatch.setenv("PGSSLMODE", "require")
    assert debezium.peer_database(url, "s").sslmode == "require"
    db = debezium.peer_database(url + "?application_name=x&sslmode=disable", "s")
    assert db.sslmode == "disable"
    props = debezium.connector_properties(db, "ns1", poll_interval_ms=1)
    assert props["database.sslmode"] == "disable"


def test_report_says_whether_postgresql_was_read_over_tls() -> None:
    document = {
        "runs": [],
        "scale": {"events": 1, "rate": 1, "seconds": 1},
        "machine": {"postgresql": "15.14", "postgresql_tls": False},
    }
    assert "PostgreSQL 15.14, every system connected without TLS" in printed.report_lines(document)
    document["machine"]["postgresql_tls"] = True
    assert "PostgreSQL 15.14, every system connected with TLS" in printed.report_lines(document)
    # Files from before the field was kept say nothing rather than guess.
    assert printed.database_line({"postgresql": "15.14"}) == []


def test_worker_producer_matches_the_relays_guarantees() -> None:
    props = debezium.worker_properties("127.0.0.1:9092", Path("/w"), 26301)
    assert props["producer.acks"] == "all"
    assert props["producer.enable.idempotence"] == "true"
    assert props["producer.linger.ms"] == "0"
    assert props["listeners"] == "http://127.0.0.1:26301"


def test_properties_escape_backslashes() -> None:
    assert debezium.render_properties({"a": "x\\y", "b": "z"}) == "a=x\\\\y\nb=z\n"


def test_cpu_lines_show_each_process_group_per_system() -> None:
    rows = [
        _row(
            1,
            "relay",
            "drain",
            client_cpu_us_per_event=30.0,
            postgres_cpu_us_per_event=25.0,
            broker_cpu_us_per_event=8.0,
        ),
        _row(1, "raw-send", "drain", client_cpu_us_per_event=21.0, broker_cpu_us_per_event=7.5),
        _row(1, "debezium-poll1ms", "drain", rate=5000.0),  # no CPU figures: not shown
    ]
    lines = printed.cpu_lines(rows)
    relay = next(line for line in lines if line.startswith("relay"))
    assert relay.split()[1:] == ["30.0", "25.0", "8.0", "63.0"]
    raw = next(line for line in lines if line.startswith("raw-send"))
    assert raw.split()[1:] == ["21.0", "0.0", "7.5", "28.5"]
    assert not any(line.startswith("debezium") for line in lines)
    assert printed.cpu_lines([_row(1, "relay", "drain", rate=1.0)]) == []


def test_postgres_cpu_is_shown_by_process_kind_for_the_systems_that_read_the_database() -> None:
    split = {"pg_backends_cpu_us_per_event": 9.0, "pg_walwriter_cpu_us_per_event": 2.0}
    rows = [
        _row(1, "relay", "drain", client_cpu_us_per_event=30.0, **split),
        _row(2, "relay", "drain", client_cpu_us_per_event=30.0, pg_backends_cpu_us_per_event=11.0),
        _row(1, "raw-send", "drain", client_cpu_us_per_event=21.0),
    ]
    lines = printed.postgres_cpu_lines(rows)
    assert lines[2].split() == ["backends", "walwriter"]
    relay = next(line for line in lines if line.startswith("relay"))
    assert relay.split()[1:] == ["10.0", "2.0"]  # medians over the runs that have the figure
    assert not any(line.startswith("raw-send") for line in lines)
    assert printed.postgres_cpu_lines(rows[2:]) == []


def test_cpu_meter_counts_the_client_process_from_its_start() -> None:
    meter = measure.CpuMeter(os.getpid())
    meter.start()
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    figures = meter.per_event_us(1000)
    assert figures["client_cpu_us_per_event"] >= 30.0  # 0.05 s over 1,000 events
    assert set(figures) == {
        "client_cpu_us_per_event",
        "postgres_cpu_us_per_event",
        "broker_cpu_us_per_event",
        *(f"pg_{kind}_cpu_us_per_event" for kind in measure.PG_KINDS),
    }


@pytest.mark.parametrize(
    ("title", "kind"),
    [
        ("postgres: walwriter ", "walwriter"),
        ("postgres: 15/main: walwriter ", "walwriter"),
        ("postgres: io worker 2", "io_workers"),
        ("postgres: 15/main: autovacuum worker outbox", "autovacuum"),
        ("postgres: autovacuum launcher ", "autovacuum"),
        ("postgres: checkpointer ", "writers"),
        ("postgres: 15/main: background writer ", "writers"),
        ("postgres: walsender debezium 127.0.0.1(40312) START_REPLICATION", "walsender"),
        ("postgres: logical replication launcher ", "other"),
        ("postgres: outbox outbox 127.0.0.1(43846) idle", "backends"),
        ("postgres: 15/main: outbox postgres 127.0.0.1(43846) SELECT", "backends"),
        ("/usr/lib/postgresql/15/bin/postgres -D /var/lib/postgresql/15/main", "other"),
    ],
)
def test_postgres_processes_are_told_apart_by_their_title(title: str, kind: str) -> None:
    assert measure.postgres_kind(title.strip()) == kind


def _server_process_here(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as comm:
            return comm.read().strip() == "postgres"
    except OSError:
        return False


async def _burn(conn: asyncpg.Connection, seconds: float) -> None:
    """Keep the connection's backend busy until it has used ``seconds`` of CPU."""
    pid = conn.get_server_pid()
    while measure.cpu_seconds([pid]) < seconds:
        await conn.fetchval("SELECT count(*) FROM generate_series(1, 500000)")


async def test_cpu_meter_counts_postgres_processes_born_and_ended_inside_its_window(
    database_url: str,
) -> None:
    """A catch-up's autovacuum workers (and any connection opened during it) start after the
    meter does, and a worker may also end before the last record: their CPU is PostgreSQL's."""
    meter = measure.CpuMeter(None)
    meter.start()
    ended = await asyncpg.connect(database_url)
    kept = await asyncpg.connect(database_url)
    try:
        pids = [ended.get_server_pid(), kept.get_server_pid()]
        if not all(_server_process_here(pid) for pid in pids):
            pytest.skip("the server's processes are not on this machine")
        for conn in (ended, kept):
            await _burn(conn, 0.15)
        burned_by_ended = measure.cpu_seconds(pids[:1])
        burned_by_kept = measure.cpu_seconds(pids[1:])
        await ended.close()
        for _ in range(200):  # the backend exits, and the postmaster reaps it, just after
            if not _server_process_here(pids[0]):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        figures = meter.per_event_us(1_000_000)  # so each figure reads in seconds
    finally:
        await kept.close()
    tick = 1e-9  # the sums of clock ticks are floats
    assert figures["postgres_cpu_us_per_event"] >= burned_by_ended + burned_by_kept - tick
    assert figures["pg_backends_cpu_us_per_event"] >= burned_by_kept - tick
    assert figures["pg_ended_cpu_us_per_event"] >= burned_by_ended - tick
    split = sum(v for k, v in figures.items() if k.startswith("pg_"))
    assert split == pytest.approx(figures["postgres_cpu_us_per_event"])


@pytest.mark.parametrize(
    ("to_sidecar_empty", "mark"), [(1.4, "PASS"), (1.5, "PASS"), (1.51, "FAIL")]
)
def test_sidecar_target_is_judged_against_its_own_empty_history(
    tmp_path: Path, to_sidecar_empty: float, mark: str
) -> None:
    figures = tmp_path / "health_cost.json"
    figures.write_text(
        f'{{"ratio": 1.7, "ratio_grace_0": 11.6, "ratio_to_sidecar_empty": {to_sidecar_empty}}}'
    )
    verdict_mark, text = costs.health_cost_line(figures)
    assert verdict_mark == mark
    assert (
        f"{to_sidecar_empty:.2f}x" in text and "one-shot check on the empty history: 1.70x" in text
    )
    assert costs.health_cost_line(tmp_path / "absent.json")[0] == "n/a"


@pytest.mark.parametrize(("beyond", "mark"), [(1.05, "PASS"), (2.0, "PASS"), (2.01, "FAIL")])
def test_check_beyond_the_look_back_window_is_judged_as_check_evaluates(
    tmp_path: Path, beyond: float, mark: str
) -> None:
    figures = tmp_path / "health_cost.json"
    figures.write_text(f'{{"ratio_beyond_lookback": {beyond}, "ratio_beyond_lookback_warm": 2.38}}')
    verdict_mark, text = costs.beyond_lookback_line(figures)
    assert verdict_mark == mark
    assert f"{beyond:.2f}x" in text and "2.38x" in text
    # Figures from before the bench measured it: no verdict, and the reason.
    figures.write_text('{"ratio": 1.7}')
    assert costs.beyond_lookback_line(figures)[0] == "n/a"
    assert costs.beyond_lookback_line(tmp_path / "absent.json")[0] == "n/a"


def test_a_report_of_other_figures_draws_its_plot_beside_them(tmp_path: Path) -> None:
    """Reading a trial's figures must not overwrite the committed plot of the last run."""
    results = tmp_path / "trial.json"
    latency = {"p50": 1.0, "p90": 2.0, "p99": 3.0, "p999": 4.0}
    rows = [
        _row(1, "relay", "drain", rate=20_000.0),
        _row(1, "raw-send", "drain", rate=22_000.0),
        _row(1, "relay", "latency", **latency),
        _row(1, "raw-send", "latency", **latency),
    ]
    results.write_text(json.dumps({"runs": rows, "scale": {"events": 200_000}}))
    committed = files.PLOT.read_bytes() if files.PLOT.exists() else None
    assert main([str(results)]) == 0
    assert (tmp_path / "peers.png").stat().st_size > 0
    assert (files.PLOT.read_bytes() if files.PLOT.exists() else None) == committed


@pytest.mark.parametrize(
    ("backlog", "peak", "mark"),
    [
        (1_000_000, 59.0, "PASS"),
        (1_000_000, 150.0, "PASS"),
        (1_000_000, 151.0, "FAIL"),
        (20_000, 400.0, "info"),  # a trial's smaller backlog is shown, not judged
    ],
)
def test_memory_target_is_judged_on_the_memory_benchmarks_million_events(
    tmp_path: Path, backlog: int, peak: float, mark: str
) -> None:
    figures = tmp_path / "memory.json"
    figures.write_text(json.dumps({"backlog": backlog, "peak_rss_mb": peak}))
    verdict_mark, text = costs.memory_line(figures)
    assert verdict_mark == mark
    assert f"{peak:.0f} MB" in text and f"{backlog:,}" in text


def test_memory_target_without_figures_is_not_applicable(tmp_path: Path) -> None:
    assert costs.memory_line(tmp_path / "absent.json")[0] == "n/a"
    (tmp_path / "memory.json").write_text('{"backlog": 1000000}')
    assert costs.memory_line(tmp_path / "memory.json")[0] == "n/a"


def test_memory_figures_go_beside_the_comparisons_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trial with BENCH_RESULTS must not overwrite the committed memory figure."""
    monkeypatch.setenv("BENCH_RESULTS", str(tmp_path / "trial" / "results.json"))
    assert files.memory_figures() == tmp_path / "trial" / "memory.json"
    monkeypatch.delenv("BENCH_RESULTS")
    assert files.memory_figures() == files.DOCS_BENCH / "memory.json"


def _trial(tmp_path: Path, *, relay_rate: float, memory: dict[str, float] | None = None) -> Path:
    """A trial's figures: the relay's drain at ``relay_rate`` against raw send() at 22,000/s,
    and bench/test_memory.py's figures beside them when given."""
    results = tmp_path / "results.json"
    latency = {"p50": 1.0, "p90": 2.0, "p99": 3.0, "p999": 4.0}
    rows = [
        _row(1, "relay", "drain", rate=relay_rate),
        _row(1, "raw-send", "drain", rate=22_000.0),
        _row(1, "relay", "latency", **latency),
        _row(1, "raw-send", "latency", **latency),
    ]
    results.write_text(json.dumps({"runs": rows, "scale": {"events": 200_000}}))
    if memory is not None:
        (tmp_path / "memory.json").write_text(json.dumps(memory))
    return results


def test_the_report_exits_1_when_a_target_fails_after_printing_and_plotting_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _trial(tmp_path, relay_rate=11_000.0)  # 0.5 x raw send(): bound >= 0.9
    assert main([str(results)]) == 1
    out = capsys.readouterr().out
    assert any(line.startswith("FAIL   drain: relay / raw send()") for line in out.splitlines())
    assert "medians" in out and f"plot: {tmp_path / 'peers.png'}" in out
    assert (tmp_path / "peers.png").stat().st_size > 0


def test_the_memory_benchmarks_peak_beside_the_figures_is_judged_by_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = _trial(
        tmp_path, relay_rate=20_000.0, memory={"backlog": 1_000_000, "peak_rss_mb": 151.0}
    )
    assert main([str(results)]) == 1
    line = next(
        line for line in capsys.readouterr().out.splitlines() if "1,000,000-event backlog" in line
    )
    assert line.startswith("FAIL") and "151 MB" in line


def test_the_report_reads_the_figures_bench_results_names_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """make bench runs the report without a path: with BENCH_RESULTS it must judge the
    figures that run wrote (and the memory figures beside them), not the committed ones."""
    results = _trial(
        tmp_path, relay_rate=20_000.0, memory={"backlog": 1_000_000, "peak_rss_mb": 151.0}
    )
    monkeypatch.setenv("BENCH_RESULTS", str(results))
    assert main([]) == 1
    assert f"raw figures: {results}" in capsys.readouterr().out


def test_latency_at_or_below_zero_is_drawn_at_the_log_axis_floor_and_marked() -> None:
    """The broker's LogAppendTime has millisecond resolution, so the raw producer's p50 can
    come out negative: a log axis cannot draw it, and the bar must not silently vanish."""
    heights, marks = plot.log_bars([-0.3, 0.0, 0.02, 1.5, None], floor=0.01)
    assert heights == [0.01, 0.01, 0.02, 1.5, 0.01]
    assert marks == ["≤0", "≤0", "", "", "n/a"]


def test_a_window_of_produce_requests_is_the_difference_of_two_readings() -> None:
    before = {"TotalTimeMs": (100, 2.0), "LocalTimeMs": (100, 1.0), "RequestBytes": (100, 500.0)}
    after = {"TotalTimeMs": (150, 1.5), "LocalTimeMs": (150, 1.0), "RequestBytes": (150, 700.0)}
    window = measure.produce_window(before, after)
    assert window["produce_requests"] == 50
    assert window["produce_total_ms"] == pytest.approx((225 - 200) / 50)  # 0.5 ms each
    assert window["produce_local_ms"] == pytest.approx(1.0)
    assert window["produce_request_bytes"] == pytest.approx((105_000 - 50_000) / 50)
    assert measure.produce_window(before, before) == {}
    assert measure.produce_window({}, after) == {}


@pytest.mark.parametrize(("count_after", "sum_after"), [(7, 29), (11, 15), (11, 25), (13, 15)])
def test_a_window_is_exact_though_the_broker_gives_means(count_after: int, sum_after: int) -> None:
    """The broker records whole milliseconds and bytes and reports count and mean; mean *
    count is off by a rounding error (29 / 7 * 7 ≠ 29), which once made a window's total
    time come out below its local time (0.05 ≥ 0.05000000000001137 failed). The sums are
    whole numbers, so the window is computed from them exactly."""
    before = {"TotalTimeMs": (1, 0.0), "LocalTimeMs": (1, 0.0)}
    after = {
        "TotalTimeMs": (count_after, sum_after / count_after),
        "LocalTimeMs": (count_after, sum_after / count_after),
    }
    window = measure.produce_window(before, after)
    assert window["produce_total_ms"] == sum_after / (count_after - 1)
    assert window["produce_total_ms"] == window["produce_local_ms"]


async def test_the_brokers_own_produce_timings_count_each_request(kafka_bootstrap: str) -> None:
    """Read against the real broker: every acknowledged send is one Produce request."""
    before = await asyncio.to_thread(measure.read_produce_metrics, kafka_bootstrap)
    if not before:
        if REQUIRED:
            pytest.fail("the broker runs here but its request metrics could not be read")
        pytest.skip("the broker is not a process on this machine")
    topic = f"t{uuid.uuid4().hex[:10]}-jmx"
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=0)
    await producer.start()
    try:
        for n in range(20):
            await producer.send_and_wait(topic, b"x" * 100, key=b"%d" % n)
    finally:
        await producer.stop()
        await measure.delete_topics(kafka_bootstrap, [topic])
    window = measure.produce_window(
        before, await asyncio.to_thread(measure.read_produce_metrics, kafka_bootstrap)
    )
    assert window["produce_requests"] >= 20
    assert window["produce_total_ms"] >= window["produce_local_ms"] >= 0
    assert window["produce_request_bytes"] > 100


def test_the_brokers_produce_timings_are_shown_per_phase_and_system() -> None:
    produce = {
        "produce_requests": 100.0,
        "produce_request_bytes": 2048.0,
        "produce_local_ms": 0.3,
        "produce_total_ms": 0.8,
    }
    rows = [
        _row(1, "relay", "latency", count=1000.0, **produce),
        _row(1, "relay", "drain", events=200_000.0, **{**produce, "produce_requests": 1000.0}),
        _row(1, "raw-send", "drain", events=200_000.0),  # read nothing: not shown
    ]
    lines = printed.produce_lines(rows)
    latency = lines.index(next(line for line in lines if "latency phase" in line))
    drain = lines.index(next(line for line in lines if "drain phase" in line))
    assert lines[latency + 2].split() == [
        "relay",
        "10.0",
        "2.0",
        "0.00",
        "0.30",
        "0.00",
        "0.00",
        "0.80",
    ]
    assert lines[drain + 2].split()[:2] == ["relay", "200.0"]
    assert not any(line.startswith("raw-send") for line in lines)
    assert printed.produce_lines(rows[2:]) == []


async def _topic_names(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def test_a_measurement_s_topics_are_deleted_and_a_missing_one_is_no_error(
    kafka_bootstrap: str,
) -> None:
    """Every drain leaves 250 MB on the development broker unless its topic goes."""
    topic = f"t{uuid.uuid4().hex[:10]}-scratch"

    async def listed() -> bool:
        return topic in await _topic_names(kafka_bootstrap)

    async def gone() -> bool:
        return not await listed()

    # The controller answers once the change is committed; the broker's metadata, which
    # list_topics reads, applies it a moment later (a direct read failed 1 run in 6).
    await measure.create_topic(kafka_bootstrap, topic)
    await wait_until(listed, timeout=10, what="the new topic listed")
    await measure.delete_topics(kafka_bootstrap, [topic])
    await wait_until(gone, timeout=10, what="the deleted topic gone from the list")
    await measure.delete_topics(kafka_bootstrap, [topic])  # already gone
    await measure.delete_topics(kafka_bootstrap, [])
