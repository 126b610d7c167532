"""scripts/services.sh waits for a broker that is still loading its logs.

A development broker stopped uncleanly (a session that ended without `services-down`)
recovers every partition it holds before it answers. With the benchmarks' topics that was
2,082 partitions and 100 s here, and `up` gave up after its 90 s. The wait now runs out
only once the broker's own count of loaded logs stops moving.

The script's `kafka_wait` runs as it is, sourced; only the probe is replaced (the broker
"answers" once a file appears) and the broker is a `sleep`.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

SERVICES_SH = Path(__file__).resolve().parents[2] / "scripts" / "services.sh"

_HARNESS = """
source "$SERVICES_SH"
KAFKA_DIR="$1"
KAFKA_WAIT_SECONDS=2
kafka_probe() { [[ -f "$KAFKA_DIR/answers" ]]; }
sleep 60 &
broker=$!
trap 'kill $broker 2>/dev/null' EXIT
kafka_wait "$broker"
echo waited
"""


def _line(done: int, total: int) -> str:
    return (
        f"[2026-12-04 06:15:21,181] INFO Completed load of Log(dir=/data/t-{done}, topic=t) "
        f"with 1 segments in 35ms ({done}/{total} completed in /data) (kafka.log.LogManager)\n"
    )


def _start(kafka_dir: Path) -> subprocess.Popen[str]:
    (kafka_dir / "logs").mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        ["bash", "-c", _HARNESS, "harness", str(kafka_dir)],
        env={"SERVICES_SH": str(SERVICES_SH), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_the_wait_goes_on_while_the_broker_loads_its_logs(tmp_path: Path) -> None:
    kafka_dir = tmp_path / "kafka"
    wait = _start(kafka_dir)
    log = kafka_dir / "logs" / "server.log"
    started = time.monotonic()
    # Loading takes twice the wait's 2 s, a log every 0.4 s, then the broker answers.
    for done in range(1, 11):
        with log.open("a") as out:
            out.write(_line(done, 10))
        time.sleep(0.4)
    (kafka_dir / "answers").touch()
    out, err = wait.communicate(timeout=30)
    assert wait.returncode == 0, err
    assert out.strip() == "waited"
    assert time.monotonic() - started >= 4.0
    assert "kafka: loading its logs" in err


def test_a_broker_that_shows_no_progress_is_given_up_on(tmp_path: Path) -> None:
    kafka_dir = tmp_path / "kafka"
    started = time.monotonic()
    wait = _start(kafka_dir)
    _, err = wait.communicate(timeout=30)
    assert wait.returncode == 1
    assert "kafka: broker did not answer on 127.0.0.1:9092" in err
    assert time.monotonic() - started < 10


def test_loading_lines_of_an_earlier_start_are_not_progress(tmp_path: Path) -> None:
    # The broker's server.log is appended to across starts: what an earlier start logged
    # must not keep this wait alive. services.sh notes the log's size when it starts one.
    kafka_dir = tmp_path / "kafka"
    (kafka_dir / "logs").mkdir(parents=True)
    log = kafka_dir / "logs" / "server.log"
    log.write_text("".join(_line(done, 400) for done in range(1, 400)))
    (kafka_dir / "server.log.offset").write_text(str(log.stat().st_size))
    wait = _start(kafka_dir)
    _, err = wait.communicate(timeout=30)
    assert wait.returncode == 1, err
    assert "loading its logs" not in err
