"""torchmon.rank_info(): torchrun's environment as an immutable record
(docs/api.md, "`rank_info` and the per-rank sinks")."""

from __future__ import annotations

import pickle
import socket
from datetime import datetime
from pathlib import Path

import pytest
from support import clear_torchrun_env

import torchmon


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The process environment without any of torchrun's variables."""
    clear_torchrun_env(monkeypatch)
    return monkeypatch


def set_env(monkeypatch: pytest.MonkeyPatch, **variables: str) -> None:
    for variable, value in variables.items():
        monkeypatch.setenv(variable, value)


def test_outside_torchrun_it_describes_one_process(torchrun_env: pytest.MonkeyPatch) -> None:
    info = torchmon.rank_info()
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size) == (0, 0, 1, 1)
    assert info.group_rank == info.node == 0
    assert info.run_id is None
    assert info.host == socket.gethostname()
    assert info.labels() == {"rank": "0", "local_rank": "0", "node": "0", "job": ""}


def test_reads_what_torchrun_sets(torchrun_env: pytest.MonkeyPatch) -> None:
    # Rank 6 of 8: the third of four ranks on the second of two nodes.
    set_env(
        torchrun_env,
        RANK="6",
        LOCAL_RANK="2",
        WORLD_SIZE="8",
        LOCAL_WORLD_SIZE="4",
        GROUP_RANK="1",
        TORCHELASTIC_RUN_ID="pretrain-42",
    )
    info = torchmon.rank_info()
    assert info == torchmon.RankInfo(
        rank=6,
        local_rank=2,
        world_size=8,
        local_world_size=4,
        group_rank=1,
        run_id="pretrain-42",
        host=socket.gethostname(),
    )
    assert info.labels() == {"rank": "6", "local_rank": "2", "node": "1", "job": "pretrain-42"}
    assert info.format("events-rank{rank}-node{node}.jsonl") == "events-rank6-node1.jsonl"


def test_an_explicit_mapping_is_read_instead_of_the_environment(
    torchrun_env: pytest.MonkeyPatch,
) -> None:
    set_env(torchrun_env, RANK="1", WORLD_SIZE="2")
    info = torchmon.rank_info({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"})
    assert (info.rank, info.world_size) == (3, 4)


def test_local_world_size_defaults_to_the_world_size(torchrun_env: pytest.MonkeyPatch) -> None:
    # A launcher that sets LOCAL_RANK but not LOCAL_WORLD_SIZE.
    info = torchmon.rank_info({"RANK": "2", "LOCAL_RANK": "2", "WORLD_SIZE": "4"})
    assert (info.local_rank, info.local_world_size) == (2, 4)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"RANK": "abc"}, "RANK='abc' is not a non-negative integer"),
        ({"LOCAL_RANK": "-1"}, "LOCAL_RANK='-1' is not a non-negative integer"),
        ({"WORLD_SIZE": "2.0"}, "WORLD_SIZE='2.0' is not a non-negative integer"),
        ({"GROUP_RANK": ""}, "GROUP_RANK='' is not a non-negative integer"),
        ({"LOCAL_WORLD_SIZE": "\u0662"}, "LOCAL_WORLD_SIZE='\u0662' is not"),
        ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK=4 must be < WORLD_SIZE=4"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be >= 1"),
        (
            {"LOCAL_RANK": "4", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"},
            "LOCAL_RANK=4 must be < LOCAL_WORLD_SIZE=4",
        ),
        (
            {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "4"},
            "LOCAL_WORLD_SIZE=4 must be <= WORLD_SIZE=2",
        ),
    ],
)
def test_bad_values_name_the_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=r"^rank_info: ") as excinfo:
        torchmon.rank_info(environ)
    assert message in str(excinfo.value)


def test_the_record_is_immutable_hashable_and_picklable() -> None:
    info = torchmon.rank_info({"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "j"})
    with pytest.raises(AttributeError, match="immutable"):
        info.rank = 0  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del info.run_id  # type: ignore[misc]
    with pytest.raises(AttributeError):
        info.extra = 1  # type: ignore[attr-defined]
    assert pickle.loads(pickle.dumps(info)) == info
    assert hash(pickle.loads(pickle.dumps(info))) == hash(info)
    assert info != torchmon.rank_info({"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "j"})
    labels = info.labels()
    labels["rank"] = "9"
    assert info.labels()["rank"] == "1"
    assert "rank=1" in repr(info) and "run_id='j'" in repr(info)


def test_constructor_checks_its_arguments() -> None:
    # The one format of an argument error (python/torchmon/_errors.py).
    with pytest.raises(TypeError, match=r"RankInfo\(rank\): rank must be an int, not str"):
        torchmon.RankInfo(rank="0")  # type: ignore[arg-type]
    world_size = r"RankInfo\(world_size\): world_size must be an int, not bool"
    with pytest.raises(TypeError, match=world_size):
        torchmon.RankInfo(world_size=True)
    with pytest.raises(ValueError, match=r"^RankInfo\(rank\): rank must be < world_size=2, got 2$"):
        torchmon.RankInfo(rank=2, world_size=2, local_world_size=2)
    with pytest.raises(TypeError, match=r"RankInfo\(run_id\)"):
        torchmon.RankInfo(run_id=3)  # type: ignore[arg-type]


def test_format_names_an_unknown_field() -> None:
    info = torchmon.RankInfo()
    with pytest.raises(ValueError, match=r"names 'rnak', which is not one of rank, "):
        info.format("events-{rnak}.jsonl")
    with pytest.raises(TypeError, match=r"RankInfo.format\(template\)"):
        info.format(3)  # type: ignore[arg-type]


def test_jsonl_for_rank_writes_this_ranks_file(
    torchrun_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    set_env(torchrun_env, RANK="3", WORLD_SIZE="4", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
    with torchmon.JsonlEventHandler.for_rank(tmp_path) as sink:
        assert sink.path == str(tmp_path / "events-rank3.jsonl")
        sink(torchmon.Event("e", datetime(2024, 1, 1), {"x": 1}))
    assert [e.data for e in torchmon.read_jsonl(tmp_path / "events-rank3.jsonl")] == [{"x": 1}]
    with torchmon.JsonlEventHandler.for_rank(tmp_path, "n{node}-l{local_rank}.jsonl") as sink:
        assert sink.path == str(tmp_path / "n0-l1.jsonl")
    with pytest.raises(TypeError, match=r"for_rank\(name\)"):
        torchmon.JsonlEventHandler.for_rank(tmp_path, 3)  # type: ignore[arg-type]


def test_jsonl_for_rank_makes_a_missing_directory(
    torchrun_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """docs/guide.md ("Multi-node setups") calls ``for_rank("logs")`` in a
    directory that has no ``logs/`` yet."""
    set_env(torchrun_env, RANK="2", WORLD_SIZE="4")
    torchrun_env.chdir(tmp_path)
    with torchmon.JsonlEventHandler.for_rank("logs") as sink:
        assert sink.path == str(Path("logs", "events-rank2.jsonl"))
        sink(torchmon.Event("e", datetime(2024, 1, 1), {"x": 1}))
    assert [e.data for e in torchmon.read_jsonl(tmp_path / "logs/events-rank2.jsonl")] == [{"x": 1}]
    # Parents too, and a subdirectory in the name.
    with torchmon.JsonlEventHandler.for_rank(tmp_path / "a/b", "n{node}/r{rank}.jsonl") as sink:
        sink(torchmon.Event("e", datetime(2024, 1, 1), {"x": 2}))
    assert [e.data for e in torchmon.read_jsonl(tmp_path / "a/b/n0/r2.jsonl")] == [{"x": 2}]
    # A file where the directory should be: the OSError names it.
    (tmp_path / "taken").write_text("")
    with pytest.raises(OSError, match="taken"):
        torchmon.JsonlEventHandler.for_rank(tmp_path / "taken")
