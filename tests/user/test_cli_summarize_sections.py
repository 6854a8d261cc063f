"""``torchmon summarize events-rank*.jsonl`` over the Watchdog's section Stats
(docs/stragglers.md, docs/cli.md): the ``section.<name>`` Stats are scored
per section in their own table (the fastest rank's p50 over this rank's),
apart from the other Stats' straggler table, and a note says that a
whole-step score cannot see a straggler in synchronous training. The files
are real Stat windows written by the JSON-lines sink."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from test_cli_summarize_ranks import STRAGGLER_HEADER, summarize, table

import torchmon
from torchmon.handlers.jsonl import JsonlEventHandler
from torchmon.testing import ManualClock

SECTION_HEADER = ["section", "rank", "p50", "score"]
# The watchdog's section aggregations (torchmon._watchdog.SECTION_AGGREGATIONS).
SECTION_AGGREGATIONS = [torchmon.COUNT, torchmon.MEAN, torchmon.P50, torchmon.P99, torchmon.MAX]

# Per rank: (compute, allreduce, whole step) seconds. Rank 2 computes 4x as
# long; the others wait for it in the all-reduce, so every step takes as long.
RANKS = {0: (0.010, 0.031, 0.041), 1: (0.010, 0.031, 0.041), 2: (0.040, 0.001, 0.041)}


def write_rank(
    path: Path, compute: float, allreduce: float, step: float, *, sections: bool
) -> None:
    handler = JsonlEventHandler(path)
    handle = torchmon.register_event_handler(handler)
    try:
        with ManualClock() as clock:
            window = timedelta(seconds=2)
            stats = [(torchmon.Stat("train.step_time", [torchmon.P50], window), step)]
            if sections:
                stats += [
                    (torchmon.Stat("section.compute", SECTION_AGGREGATIONS, window), compute),
                    (torchmon.Stat("section.allreduce", SECTION_AGGREGATIONS, window), allreduce),
                ]
            for _ in range(3):  # three windows, each closed by the next one's sample
                for stat, value in stats:
                    stat.add_many([value] * 50)
                clock.advance(2000)
            for stat, value in stats:
                stat.add(value)
    finally:
        torchmon.unregister_event_handler(handle)
        handler.close()


def test_sections_are_scored_per_section_with_the_note(tmp_path: Path) -> None:
    for rank, figures in RANKS.items():
        write_rank(tmp_path / f"events-rank{rank}.jsonl", *figures, sections=True)
    result = summarize(tmp_path, *(f"events-rank{rank}.jsonl" for rank in RANKS))
    assert (result.returncode, result.stderr) == (0, "")
    # The whole step: every rank alike.
    assert table(result.stdout, STRAGGLER_HEADER) == [
        ["train.step_time", rank, "0.041", "1.000"] for rank in "012"
    ]
    assert table(result.stdout, SECTION_HEADER) == [
        ["allreduce", "0", "0.031", "0.032"],
        ["allreduce", "1", "0.031", "0.032"],
        ["allreduce", "2", "0.001", "1.000"],
        ["compute", "0", "0.01", "1.000"],
        ["compute", "1", "0.01", "1.000"],
        ["compute", "2", "0.04", "0.250"],
    ]
    tail = result.stdout[result.stdout.index("\nnote: ") + 1 :]
    assert tail.startswith("note: in synchronous training a whole-step score cannot see")
    assert "the section scores\ncan" in tail
    assert tail.endswith("(docs/stragglers.md).\n")


def test_without_sections_the_note_points_to_them(tmp_path: Path) -> None:
    for rank, figures in RANKS.items():
        write_rank(tmp_path / f"events-rank{rank}.jsonl", *figures, sections=False)
    result = summarize(tmp_path, *(f"events-rank{rank}.jsonl" for rank in RANKS))
    assert (result.returncode, result.stderr) == (0, "")
    assert "section" not in result.stdout.split("\nnote: ")[0]
    assert table(result.stdout, STRAGGLER_HEADER)[0] == ["train.step_time", "0", "0.041", "1.000"]
    assert "torchmon.Watchdog's sections" in result.stdout


def test_one_file_has_no_scores_and_no_note(tmp_path: Path) -> None:
    write_rank(tmp_path / "events-rank0.jsonl", *RANKS[2], sections=True)
    result = summarize(tmp_path, "events-rank0.jsonl")
    assert (result.returncode, result.stderr) == (0, "")
    assert "score" not in result.stdout
    assert "note:" not in result.stdout
