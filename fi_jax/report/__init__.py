"""Stage 6, report: the results schema (`schema`: what results.json holds, used by every writer
and reader), the run's files (`files`: results.json / .csv / .md, per_class/, scores/, and
their publication as one unit through `<workdir>/report`), the Markdown tables (`tables`), the
figures (`plots`), the comparison of several runs (`compare`, `python -m fi_jax.report
compare`), and a sweep's folder (`sweep_state`: which models it has, done / failed / running)
with its leaderboard (`leaderboard`, `python -m fi_jax.report leaderboard`).

Metric values are fractions in [0, 1] in the files; the tables show percent, as papers do.
`fpr95` is the ID-positive FPR@95%TPR with the K-th largest ID score as threshold (ViM, KNN
papers), `fpr95_ninco` NINCO's interpolated-quantile variant, `fpr95_ood_positive` OpenOOD
v1.5's convention — see docs/metrics.md for the exact definitions.

May import: fi_jax.common, fi_jax.data, fi_jax.models, fi_jax.extract, fi_jax.detectors,
fi_jax.metrics.
"""
from fi_jax.report.compare import compare, load_runs, paired_tests
from fi_jax.report.files import (
  INCOMPLETE,
  REPORT_ENTRIES,
  REPORT_LINK,
  ScoresError,
  StagedReport,
  load_results,
  load_scores,
  new_run_id,
  predicted_as,
  report_folder,
  versions,
  write,
  write_per_class,
  write_scores,
)
from fi_jax.report.plots import HistWriter, heatmap, write_hist, write_plots
from fi_jax.report.schema import (
  ResultsError,
  configured_detectors,
  failures,
  lower_is_better,
  ood_sets,
)
from fi_jax.report.tables import per_class_tables, ranked_detectors, sort_spec, table

__all__ = ["HistWriter", "INCOMPLETE", "REPORT_ENTRIES", "REPORT_LINK", "ResultsError",
           "ScoresError", "StagedReport", "compare", "configured_detectors", "failures",
           "heatmap", "load_results", "load_runs", "load_scores", "lower_is_better",
           "new_run_id", "ood_sets", "paired_tests", "per_class_tables", "predicted_as",
           "ranked_detectors", "report_folder", "sort_spec", "table", "versions", "write",
           "write_hist", "write_per_class", "write_plots", "write_scores"]
