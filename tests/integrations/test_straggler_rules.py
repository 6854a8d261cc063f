"""The straggler recording rules shipped in docs/straggler-rules.yml
(docs/integrations.md, "Several ranks"), evaluated by Prometheus's own rule
engine (`promtool test rules`, from the Debian prometheus package that
.ci/run installs) on the series three ranks of one job and one rank of
another would expose."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

RULES = Path(__file__).resolve().parents[2] / "docs" / "straggler-rules.yml"
RELATIVE = "torchmon:train_step_time_p50:relative_score"
INDIVIDUAL = "torchmon:train_step_time_p50:individual_score"

# (labels, p50 each minute, relative score at minute 3, individual score then):
# rank 1 is 25 % slower than rank 0; rank 2 slowed down from 0.10 s to 0.20 s
# at minute 2; the other job's single rank is its own fastest.
RANKS = [
    (dict(job="torchrun", instance="a:9400", rank="0", local_rank="0", node="0"),
     "0.10 0.10 0.10 0.10", 1.0, 1.0),
    (dict(job="torchrun", instance="a:9401", rank="1", local_rank="1", node="0"),
     "0.125 0.125 0.125 0.125", 0.8, 1.0),
    (dict(job="torchrun", instance="b:9400", rank="2", local_rank="0", node="1"),
     "0.10 0.10 0.20 0.20", 0.5, 0.5),
    (dict(job="other", instance="c:9400", rank="0", local_rank="0", node="0"),
     "0.5 0.5 0.5 0.5", 1.0, 1.0),
]  # fmt: skip


def series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ", ".join(f'{key}="{value}"' for key, value in labels.items()) + "}"


def expected(rule: str, column: int) -> dict[str, object]:
    return {
        "expr": rule,
        "eval_time": "3m",
        "exp_samples": [{"labels": series(rule, rank[0]), "value": rank[column]} for rank in RANKS],
    }


def test_the_recording_rules_score_each_rank(tmp_path: Path) -> None:
    if not RULES.is_file():
        pytest.skip("not run from a checkout: docs/ is not beside tests/")
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (Debian package prometheus, installed by .ci/run)")
    cases = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": series("train_step_time_p50", labels), "values": values}
                    for labels, values, _, _ in RANKS
                ],
                "promql_expr_test": [expected(RELATIVE, 2), expected(INDIVIDUAL, 3)],
            }
        ],
    }
    path = tmp_path / "cases.yml"
    path.write_text(json.dumps(cases), encoding="utf-8")  # JSON is YAML
    proc = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def run_promtool(tmp_path: Path, input_series: list[dict[str, str]], tests: list[Any]) -> None:
    if not RULES.is_file():
        pytest.skip("not run from a checkout: docs/ is not beside tests/")
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (Debian package prometheus, installed by .ci/run)")
    cases = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": input_series, "promql_expr_test": tests}],
    }
    path = tmp_path / "cases.yml"
    path.write_text(json.dumps(cases), encoding="utf-8")
    proc = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# The watchdog's sections on three ranks of one job: rank 2 computes 4x as
# long, the others wait for it in the all-reduce (docs/stragglers.md).
SECTION_RANKS = [
    (dict(job="torchrun", instance=f"a:940{r}", rank=str(r), local_rank=str(r), node="0"),
     {"compute": c, "allreduce": a}, {"compute": sc, "allreduce": sa})
    for r, c, a, sc, sa in ((0, 0.01, 0.03, 1.0, 0.04), (1, 0.01, 0.03, 1.0, 0.04),
                            (2, 0.04, 0.0012, 0.25, 1.0))
]  # fmt: skip


def test_the_section_rules_score_each_rank_per_section(tmp_path: Path) -> None:
    input_series = []
    relative, individual, watchdog, lowest = [], [], [], []
    for labels, p50s, scores in SECTION_RANKS:
        for section, p50 in p50s.items():
            input_series.append(
                {"series": series(f"section_{section}_p50", labels), "values": f"{p50}x3"}
            )
            input_series.append(
                {
                    "series": series(f"straggler_{section}_relative_value", labels),
                    "values": f"{scores[section]}x3",
                }
            )
            with_section = {**labels, "section": section}
            relative.append({"labels": series("torchmon:section_p50:relative_score", with_section),
                             "value": scores[section]})  # fmt: skip
            individual.append({"labels": series("torchmon:section_p50:individual_score",
                                                with_section), "value": 1.0})  # fmt: skip
            watchdog.append({"labels": series("torchmon:watchdog_relative_score", with_section),
                             "value": scores[section]})  # fmt: skip
    for section in ("allreduce", "compute"):
        lowest.append({"labels": series("torchmon:watchdog_relative_score:min",
                                        dict(job="torchrun", section=section)),
                       "value": 0.04 if section == "allreduce" else 0.25})  # fmt: skip
    tests = [
        {"expr": "torchmon:section_p50:relative_score", "eval_time": "2m", "exp_samples": relative},
        {"expr": "torchmon:section_p50:individual_score", "eval_time": "2m",
         "exp_samples": individual},
        {"expr": "torchmon:watchdog_relative_score", "eval_time": "2m", "exp_samples": watchdog},
        {"expr": "torchmon:watchdog_relative_score:min", "eval_time": "2m",
         "exp_samples": lowest},
    ]  # fmt: skip
    run_promtool(tmp_path, input_series, tests)
