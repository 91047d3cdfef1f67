"""results.json's schema (fi_jax/report/schema.py): every metric the metrics stage computes is
declared, a row with an undeclared field is refused, and a damaged results file is one error
naming it."""
import json

import numpy as np
import pytest

from fi_jax import metrics
from fi_jax.report import schema


def test_every_metric_the_metrics_stage_computes_is_a_schema_field():
  rng = np.random.default_rng(0)
  m = metrics.ood_metrics(rng.normal(1, 1, 50), rng.normal(0, 1, 40), n_bootstrap=5)
  _, grouped_table = metrics.ood_metrics_and_table(rng.normal(1, 1, 50), rng.normal(0, 1, 40),
                                                   np.repeat([0, 1], 20), n_bootstrap=5)
  assert set(metrics.METRICS) <= set(schema.METRICS)
  row = {"model": "m", "detector": "msp", "id_set": "id", "ood_set": "o", **m}
  schema.check_row(row)                                  # every key it produced is declared
  assert set(grouped_table) - {"group", "n_ood"} <= set(schema.METRICS)


def test_an_undeclared_row_field_is_refused_naming_the_row():
  row = {"model": "m", "detector": "msp", "id_set": "id", "ood_set": "o", "auroc": 0.5,
         "my_new_metric": 0.1}
  with pytest.raises(ValueError, match=r"m/msp/id/o.*my_new_metric.*METRICS"):
    schema.check_row(row)
  with pytest.raises(ValueError, match=r"missing \['ood_set'\]"):
    schema.check_row({"model": "m", "detector": "msp", "id_set": "id"})


def test_make_checks_rows_and_records_the_schema_version():
  res = schema.make({"ood_sets": ["o"]}, 0.5,
                    [{"model": "m", "detector": "msp", "id_set": "id", "ood_set": "o"}], [])
  assert res["schema"] == schema.SCHEMA_VERSION and res["failed"] == []


@pytest.mark.parametrize("text, match", [
    ('{"meta": {}, "rows": [', "not a readable results file"),
    ("[1, 2]", "not an object"),
    ('{"meta": {}, "rows": {}}', "no 'rows' list"),
    ('{"meta": {}, "rows": [{"model": "m"}]}', "row 0 lacks the key columns"),
    ('{"schema": 99, "meta": {}, "rows": []}', "schema version 99"),
])
def test_a_damaged_results_file_is_one_error_naming_it(tmp_path, text, match):
  (tmp_path / "results.json").write_text(text)
  with pytest.raises(schema.ResultsError, match=match) as e:
    schema.load(str(tmp_path))
  assert str(tmp_path / "results.json") in str(e.value)


def test_a_results_file_without_a_schema_version_is_read(tmp_path):
  (tmp_path / "results.json").write_text(json.dumps(
      {"meta": {}, "rows": [{"model": "m", "detector": "d", "id_set": "i", "ood_set": "o"}]}))
  res = schema.load(str(tmp_path))
  assert res["failed"] == [] and res["id_accuracy"] is None and len(res["rows"]) == 1
