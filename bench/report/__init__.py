"""``python -m bench.report``: PASS or FAIL per performance target, the history of judged runs,
and the plot (the command and what it does: main.py).

One module per job, each importing only those listed below it:

- main.py: the command, reading the figures and writing what it judged;
- plot.py: the plot; history.py: the history of judged runs and docs/benchmarks.md's block;
- printed.py: the printed report: the verdicts in order, then each system's medians;
- costs.py: the targets on memory and on the health sidecar's cost;
- judging.py: the targets, each one's ratio within a run, the verdict on their median;
  files.py: where the figures, the history and the document are kept.
"""
