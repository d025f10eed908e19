"""Compare the runs of a sweep: one table row per variant, the sweep's jobs and their states, curves,
error bars and significance.

    python -m zoo.report multirun/2025-01-01/12-00-00                 # writes report.md, report.html, *.png
    python -m zoo.report DIR --metric val_loss --target 4.2 --baseline ffn=gelu --out reports/
    python -m zoo.report --across DIR_A DIR_B DIR_C:exact_match --baseline narang=vanilla   # writes across.md, .png

Every run directory under DIR (one holding summary.json, metrics.csv or .hydra/overrides.yaml) is read.
Runs are grouped into variants by the Hydra overrides that differ between runs, the seed excepted, so
`python train.py -m ffn=relu,swiglu seed=0,1,2` gives two variants of three seeds each. The sweep's
multirun.yaml says which jobs it planned (expanded as Hydra's basic sweeper does); each is finished,
running (no summary.json yet, its run.lock held), failed (the summary says failed or interrupted; no
summary and no lock: killed; an unreadable summary), diverged, or missing (no directory). Failed and
diverged runs are counted in the table but left out of the statistics; running ones are neither.

Statistics (scipy.stats), over the seeds of a variant: mean, sample standard deviation (n - 1), and a 95%
confidence interval mean +- t(0.975, n - 1) * std / sqrt(n) (Student t). Two variants are compared with
Welch's two-sided t-test (unequal variances); a difference is called larger than seed noise when p < 0.05.

--across compares several sweeps, one per application (each DIR with its metric, val_loss by default): one line
per variant with its verdict against --baseline in each sweep's own report, and whether it transfers (better in
every one); across.png draws the effects, one panel per sweep.

Modules: runs (finding and reading runs, the sweep's plan), stats, tables (rows, report.md/html), plots,
callback (ReportAfterSweep, for hydra.callbacks), across (the verdicts across sweeps), cli (build_report,
write_report, build_across, main).
"""

from zoo.commands import EXIT_ERROR, EXIT_OK
from zoo.report.callback import ReportAfterSweep
from zoo.report.cli import build_report, console_summary, main, write_report
from zoo.report.runs import FAILED, Job, Plan, ReportError, Run, find_run_dirs, load_run, load_runs, match_jobs
from zoo.report.stats import confidence_interval, higher_is_better, mean_std, steps_to_target, welch_test
from zoo.report.tables import Report, Variant, group_variants

__all__ = ["EXIT_ERROR", "EXIT_OK", "FAILED", "Job", "Plan", "Report", "ReportAfterSweep", "ReportError", "Run",
           "Variant", "build_report", "confidence_interval", "console_summary", "find_run_dirs",
           "group_variants", "higher_is_better", "load_run", "load_runs", "main", "match_jobs", "mean_std",
           "steps_to_target", "welch_test", "write_report"]
