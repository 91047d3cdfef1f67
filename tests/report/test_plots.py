"""The report's figures at realistic sizes (45 detectors x 1, 2 and 10 models, synthetic results
from tests/helpers/synthetic_figures.py): sizes that grow with the grid, cell texts that do not
collide, failed cells marked with their reason, bars for one column, the ROC operating point at
the metric's threshold, histogram ranges and tail counts."""
import numpy as np
import pytest

from fi_jax.metrics import reference
from fi_jax.report import plots
from tests.helpers import synthetic_figures as syn

SET = "ninco"


def _runs(n):
  return [(syn.MODELS[m], syn.synthetic_results(syn.MODELS[m], m, sets=syn.SETS,
                                                nan_rows=[("she", SET)] if m == 2 else ()))
          for m in range(n)]


def _grid(n_models):
  """(grid, failed, detectors, models) of the compare heat map of `n_models` runs on SET."""
  runs = _runs(n_models)
  dets = plots.order_by_mean([r for _, r in runs], list(syn.DETECTORS), SET)
  grid = np.full((len(dets), n_models), np.nan)
  failed = {}
  for j, (_, res) in enumerate(runs):
    g, f, _ = plots.cells(res, dets, [SET])
    grid[:, j] = g[:, 0]
    failed.update({(i, j): r for (i, _), r in f.items()})
  return grid, failed, dets, [m for m, _ in runs]


def _texts_overlap(fig, texts):
  """Pairs of `texts` whose drawn boxes overlap (pixels)."""
  renderer = fig.canvas.get_renderer()
  boxes = [t.get_window_extent(renderer) for t in texts]
  order = sorted(range(len(boxes)), key=lambda k: boxes[k].x0)
  hits = []
  for a_pos, a in enumerate(order):
    for b in order[a_pos + 1:]:
      if boxes[b].x0 >= boxes[a].x1:
        break
      if boxes[a].overlaps(boxes[b]):
        hits.append((texts[a].get_text(), texts[b].get_text()))
  return hits


def test_cells_mark_failed_detectors_and_non_finite_values():
  (_, res), = _runs(3)[2:]
  grid, failed, ci = plots.cells(res, ["msp", "she", "no_such"], [SET])
  assert np.isfinite(grid[0, 0]) and ci[(0, 0)][0] <= grid[0, 0] <= ci[(0, 0)][1]
  assert np.isnan(grid[1:, 0]).all()
  assert failed == {(1, 0): "FPR@95 is not a finite number"}   # a null FPR@95, not a value
  (_, res1), = _runs(2)[1:]
  _, failed, _ = plots.cells(res1, ["mcm", "gram"], syn.SETS)
  assert failed[(0, 2)] == syn.FAILED[(1, "mcm")] and len(failed) == 6


@pytest.mark.parametrize("n_models, width_px, height_px", [(2, (500, 800), (1200, 1800)),
                                                           (10, (700, 1300), (1200, 1800))])
def test_heat_map_of_45_detectors_is_legible(n_models, width_px, height_px):
  """Sizes from the grid, failed cells lettered and explained, short values; at 45 x 10 (the
  densest) the drawn cell texts and row labels do not overlap."""
  grid, failed, dets, models = _grid(n_models)
  fig = plots.heatmap_figure(grid, dets, models, f"FPR@95 (%) on {SET}\n45 x {n_models}",
                             failed=failed)
  try:
    w, h = fig.get_size_inches() * plots.DPI
    assert width_px[0] <= w <= width_px[1] and height_px[0] <= h <= height_px[1], (w, h)
    ax = fig.axes[0]
    cell_texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text()
                  for t in ax.texts}
    assert len(cell_texts) == 45 * n_models
    codes = plots.failure_codes([failed[k] for k in sorted(failed)])
    for (i, j), reason in failed.items():   # a letter on each failed cell ...
      assert cell_texts[(i, j)] == "✗" + codes[plots.short_reason(reason)]
    footnote = " ".join(" ".join(t.get_text() for t in fig.texts).split())   # unwrapped
    for reason, code in codes.items():      # ... explained in the footnote
      assert f"✗{code}: {reason}" in footnote
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert len(hatched) == len(failed) > 0
    for (i, j), text in cell_texts.items():
      if (i, j) not in failed:
        assert text == plots.value_text(grid[i, j]) and len(text) <= 4
    if n_models == 10:
      fig.canvas.draw()
      assert _texts_overlap(fig, list(ax.texts)) == []
      assert _texts_overlap(fig, ax.get_yticklabels()) == []   # (x labels: rotated)
  finally:
    plots._plt().close(fig)


def test_compare_figures_are_heat_maps_per_set_and_bars_for_one_model(tmp_path):
  runs = _runs(2)
  files = plots.write_compare_figures(str(tmp_path), runs, [SET], SET)
  assert [f.split("/")[-1] for f in files] == ["compare_fpr95_ninco.png"]
  w, h = syn.pixel_size(files[0])
  assert 500 <= w <= 800 and 1200 <= h <= 1800, (w, h)
  (one,) = plots.write_compare_figures(str(tmp_path / "one"), runs[1:2], [SET], SET)
  w1, h1 = syn.pixel_size(one)
  assert 500 <= w1 <= 800 and 1000 <= h1 <= 1600, (w1, h1)   # bars: about 0.24 in each


def test_bars_sorted_with_whiskers_and_failed_last():
  values = [40.0, 10.0, np.nan, 70.0, np.nan]
  fig = plots.bars_figure(values, ["a", "b", "c", "d", "e"], "t\nmodel: m",
                          ci=[(35, 45), (8, 12), None, (60, 80), None],
                          failed={2: "ValueError: boom"})
  try:
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["b", "a", "d", "c", "e"]
    texts = [t.get_text() for t in ax.texts]
    assert texts[:3] == ["10.0", "40.0", "70.0"]
    assert "failed (✗a)" in texts and "no result" in texts
    assert "✗a: ValueError: boom" in " ".join(fig.texts[0].get_text().split())
    assert len(ax.containers) >= 2   # the bars and the CI whiskers
  finally:
    plots._plt().close(fig)


def test_operating_point_is_the_metrics_threshold_on_the_roc_curve():
  rng = np.random.default_rng(0)
  for n_id, n_ood in ((100, 37), (21, 50), (400, 400)):
    a = np.round(rng.normal(1, 1, n_id), 1)   # ties
    b = np.round(rng.normal(0, 1, n_ood), 1)
    x, y = plots.operating_point(a, b)
    assert x == reference.fpr_at_tpr(a, b)
    assert y >= 0.95 and y == np.mean(a >= np.sort(a)[::-1][reference.threshold_rank(n_id) - 1])
    fpr, tpr = reference.roc_curve(a, b)
    assert any(fpr[k] == x and tpr[k] == y for k in range(len(fpr)))   # a vertex
    assert y == tpr[np.argmax(tpr >= 0.95)]   # the first vertex at TPR >= 95%
  # by hand: 20 ID scores 1..20, K = 19, t = 2; OOD 0, 1.5, 2, 3 -> 2 of 4 accepted
  assert plots.operating_point(np.arange(1, 21.0), np.array([0, 1.5, 2, 3.0])) == (0.5, 0.95)
  assert plots.operating_point(np.arange(1, 21.0), np.array([0.0]), tpr=0.5) == (0.0, 0.5)


def test_roc_figure_marks_the_operating_points_and_names_the_subset():
  scores = syn.synthetic_scores(syn.DETECTORS[:7], [SET], n_id=300, n_ood=200)
  fig = plots.roc_figure_of(scores, syn.DETECTORS[:5], n_ranked=45, ood=SET,
                            model=syn.MODELS[0], id_set="imagenet2012")
  try:
    ax = fig.axes[0]
    assert syn.MODELS[0] in ax.get_title() and SET in ax.get_title()
    assert "top 5 of 45 detectors by FPR@95 on ninco" in ax.get_legend().get_title().get_text()
    points = {l.get_gid(): l.get_xydata()[0] for l in ax.lines
              if (l.get_gid() or "").startswith("operating_point:")}
    assert len(points) == 5
    for det in syn.DETECTORS[:5]:
      s = scores[det]
      assert tuple(points[f"operating_point:{det}"]) == plots.operating_point(s["id_test"],
                                                                            s[f"ood/{SET}"])
  finally:
    plots._plt().close(fig)


def test_histogram_range_and_tail_counts(tmp_path):
  rng = np.random.default_rng(1)
  id_scores = np.r_[rng.normal(0, 1, 994), [1e6] * 4, [-1e6] * 2, [np.nan]]   # 0.4% huge
  ood = np.r_[rng.normal(-1, 1, 498), [5e5] * 2, [np.inf]]
  lo, hi = plots.robust_range([id_scores, ood])
  pooled = np.r_[id_scores, ood]
  assert (lo, hi) == tuple(np.percentile(pooled[np.isfinite(pooled)], [0.5, 99.5]))
  assert -5 < lo < 0 < hi < 5   # the outliers do not set the range
  below, above = plots.tail_counts(id_scores, lo, hi)
  finite = id_scores[np.isfinite(id_scores)]
  assert (below, above) == (np.sum(finite < lo), np.sum(finite > hi))
  assert below >= 2 and above >= 4
  lo2, hi2, drawn = plots.hist_layout({"id_test": id_scores, f"ood/{SET}": ood}, [SET])
  assert (lo2, hi2) == (lo, hi)
  assert [(d[0], d[2], d[3]) for d in drawn] == [
      ("id_test", below, above), (f"ood/{SET}", *plots.tail_counts(ood, lo, hi))]
  assert plots.robust_range([np.full(50, 3.0)]) == (2.5, 3.5)      # constant scores
  assert plots.robust_range([np.r_[np.zeros(999), 1.0]]) == (0.0, 1.0)   # a spike
  path = plots.write_hist(str(tmp_path), "vim", {"id_test": id_scores, f"ood/{SET}": ood},
                          [SET], model="vit", id_set="imagenet2012")
  assert syn.pixel_size(path)[0] == 700
