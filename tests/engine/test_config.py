"""The engine's settings: defaults, then the TOML file in SEGSTORE_CONFIG, then SEGSTORE_* variables.

The server's own settings, read from the same file and variables, are tested in tests/app/test_settings.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import InvalidArgument, Settings, load_settings


def toml(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "segstore.toml"
    path.write_text(text)
    return {"SEGSTORE_CONFIG": str(path)}


def test_defaults_need_nothing() -> None:
    settings = load_settings({})
    assert settings == Settings()
    assert settings.data_dir == "./data" and settings.tier2_path == Path("data/tier2")
    assert settings.container_count == 4 and settings.flush_threshold_ms == 1000


def test_toml_file(tmp_path: Path) -> None:
    env = toml(
        tmp_path,
        'data_dir = "/srv/seg"\ntier2 = "/mnt/t2"\ncontainer_count = 8\ntail_wait_max_s = 2.5\n'
        "cache_max_bytes = 1048576\n",
    )
    settings = load_settings(env)
    assert settings.data_dir == "/srv/seg" and settings.tier2_path == Path("/mnt/t2")
    assert settings.container_count == 8 and settings.tail_wait_max_s == 2.5
    assert settings.cache_max_bytes == 1 << 20
    assert settings.flush_threshold_ms == 1000  # untouched default


def test_environment_overrides_toml_and_overrides_win(tmp_path: Path) -> None:
    env = toml(tmp_path, "container_count = 8\nflush_threshold_ms = 5\n")
    env |= {"SEGSTORE_CONTAINER_COUNT": "2", "SEGSTORE_TAIL_WAIT_MAX_S": "0.5"}
    settings = load_settings(env)
    assert (settings.container_count, settings.flush_threshold_ms, settings.tail_wait_max_s) == (2, 5, 0.5)
    assert load_settings(env, container_count=3).container_count == 3


def test_environment_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEGSTORE_FLUSH_THRESHOLD_BYTES", "123")
    monkeypatch.delenv("SEGSTORE_CONFIG", raising=False)
    assert load_settings().flush_threshold_bytes == 123


@pytest.mark.parametrize(
    "env",
    [
        {"SEGSTORE_CONTAINER_COUNT": "many"},
        {"SEGSTORE_CONTAINER_COUNT": "0"},
        {"SEGSTORE_CONTAINER_COUNT": "1.5"},
        {"SEGSTORE_FLUSH_THRESHOLD_MS": "-1"},
        {"SEGSTORE_TAIL_WAIT_MAX_S": "soon"},
        {"SEGSTORE_CACHE_MAX_BYTES": "-5"},
        {"SEGSTORE_MAX_FRAME_BYTES": "4095"},
    ],
)
def test_bad_environment_values(env: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument):
        load_settings(env)


@pytest.mark.parametrize(
    "line",
    ['container_count = "many"', "container_count = 2.5", "container_count = true", "tail_wait_max_s = [1]"],
)
def test_toml_value_of_the_wrong_type_is_refused(tmp_path: Path, line: str) -> None:
    with pytest.raises(InvalidArgument, match=line.split(" ")[0]):
        load_settings(toml(tmp_path, line + "\n"))


def test_unknown_toml_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="flush_treshold_ms"):
        load_settings(toml(tmp_path, "flush_treshold_ms = 5\n"))


def test_settings_check_themselves() -> None:
    with pytest.raises(InvalidArgument):
        Settings(flush_threshold_bytes=-1)
    with pytest.raises(InvalidArgument):
        Settings(container_count=0)
    assert Settings().replace(container_count=2).container_count == 2


@pytest.mark.parametrize(
    ("tier2", "expected"),
    [
        ("s3://bucket", ("bucket", "")),
        ("s3://bucket/", ("bucket", "")),
        ("s3://bucket/pre/fix", ("bucket", "pre/fix/")),
        ("s3://bucket/pre/fix/", ("bucket", "pre/fix/")),
        ("s3://my.bucket-1/segstore", ("my.bucket-1", "segstore/")),
    ],
)
def test_tier2_s3_names_bucket_and_prefix(tier2: str, expected: tuple[str, str]) -> None:
    assert Settings(tier2=tier2).tier2_s3 == expected
    assert load_settings({"SEGSTORE_TIER2": tier2}).tier2_s3 == expected


@pytest.mark.parametrize("tier2", ["", "/mnt/t2", "relative/t2", "S3:/bucket", "file:///x"])
def test_tier2_folder_is_not_s3(tier2: str) -> None:
    assert Settings(tier2=tier2).tier2_s3 is None


@pytest.mark.parametrize("tier2", ["s3://", "s3:///prefix"])
def test_tier2_s3_without_a_bucket_is_refused(tier2: str) -> None:
    with pytest.raises(InvalidArgument, match="bucket"):
        Settings(tier2=tier2).tier2_s3  # noqa: B018


def test_chunk_and_read_settings_come_from_toml(tmp_path: Path) -> None:
    env = toml(
        tmp_path,
        'tier2 = "s3://b/p"\ns3_endpoint = "http://127.0.0.1:9000"\nrollover_bytes = 1024\n'
        "defrag_min_chunks = 3\ndefrag_small_bytes = 100\nstorage_read_block_bytes = 4096\n"
        "read_ahead_bytes = 0\n",
    )
    settings = load_settings(env)
    assert settings.tier2_s3 == ("b", "p/") and settings.s3_endpoint == "http://127.0.0.1:9000"
    assert (settings.rollover_bytes, settings.defrag_min_chunks, settings.defrag_small_bytes) == (
        1024,
        3,
        100,
    )
    assert (settings.storage_read_block_bytes, settings.read_ahead_bytes) == (4096, 0)


@pytest.mark.parametrize(
    ("tier1", "tier2", "message"),
    [
        ("/var/lib/t1", "", "local files or s3://"),
        ("s3://bucket/t1", "", "tier2 is a local folder"),
        ("s3://bucket/same", "s3://bucket/same", "prefixes of their own"),
        ("s3://bucket/t1", "s3://bucket", "prefixes of their own"),
        ("s3://bucket/t", "s3://bucket/t/2", "prefixes of their own"),
    ],
)
def test_tier1_on_s3_is_refused_where_a_node_loss_loses_data(tier1: str, tier2: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Settings(tier1=tier1, tier2=tier2)


def test_tier1_and_tier2_on_s3_under_prefixes_of_their_own() -> None:
    settings = Settings(tier1="s3://bucket/tier1", tier2="s3://bucket/tier2")
    assert settings.tier1_s3 == ("bucket", "tier1/")
    assert Settings(tier1="s3://one", tier2="s3://two").tier1_s3 == ("one", "")


def test_a_cluster_node_says_where_it_is_reached() -> None:
    with pytest.raises(InvalidArgument, match="advertise_url"):
        Settings(node_id="a", tier1="s3://b/t1", tier2="s3://b/t2")
    node = Settings(node_id="a", tier1="s3://b/t1", tier2="s3://b/t2", advertise_url="http://a:8080/")
    assert node.node_url == "http://a:8080"


@pytest.mark.parametrize("count", [0, 9])
def test_tier1_writes_in_flight_lies_within_what_a_fence_covers(count: int) -> None:
    with pytest.raises(InvalidArgument, match=r"tier1_writes_in_flight must lie in \[1, 8\]"):
        Settings(tier1_writes_in_flight=count)
    assert load_settings({"SEGSTORE_TIER1_WRITES_IN_FLIGHT": "8"}).tier1_writes_in_flight == 8


@pytest.mark.parametrize(
    "name",
    [
        "rollover_bytes",  # the storage writer failed on its first flush
        "max_append_bytes",
        "max_read_bytes",  # a reader looping for ever on empty reads
        "tier1_backlog_max_bytes",
        "cache_block_bytes",
        "storage_read_block_bytes",
        "tail_wait_max_s",  # live streams spinning on keep-alives
        "transaction_timeout_s",
    ],
)
def test_settings_with_no_meaning_at_zero_refuse_it(name: str) -> None:
    with pytest.raises(InvalidArgument, match=f"{name} must be more than 0"):
        Settings(**{name: 0})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("8 MiB", 8 << 20), ("64MiB", 64 << 20), ("1 GiB", 1 << 30), ("512 KiB", 512 << 10), ("4096", 4096)],
)
def test_sizes_are_accepted_as_the_settings_table_writes_them(
    tmp_path: Path, raw: str, expected: int
) -> None:
    assert load_settings({"SEGSTORE_CACHE_MAX_BYTES": raw}).cache_max_bytes == expected
    assert load_settings(toml(tmp_path, f'cache_max_bytes = "{raw}"\n')).cache_max_bytes == expected


@pytest.mark.parametrize("raw", ["8 MB", "8M", "lots", "1.5 GiB", "-1 MiB"])
def test_a_size_in_another_form_is_refused_with_the_expected_form(raw: str) -> None:
    with pytest.raises(InvalidArgument, match=r"cache_max_bytes is a size: .*e\.g\. 8 MiB"):
        load_settings({"SEGSTORE_CACHE_MAX_BYTES": raw})


def test_processes_0_is_one_per_core_up_to_the_containers_with_local_tier1() -> None:
    assert Settings().processes == 0  # the default: one per core
    assert Settings().processes_to_start(64) == 4
    assert Settings(processes=1).processes_to_start(64) == 1
    assert Settings(processes=0).processes_to_start(2) == 2
    assert Settings(processes=0).processes_to_start(64) == 4  # no process without a container
    s3 = Settings(processes=0, tier1="s3://b/t1", tier2="s3://b/t2")
    assert s3.processes_to_start(8) == 1  # a cluster node is one process
    assert not Settings(processes=0).local_members  # in one process (tests, the CLI) 0 means one
    assert Settings(processes=2).local_members


def test_processes_refused_beyond_the_containers_or_on_s3_outside_a_cluster() -> None:
    with pytest.raises(InvalidArgument, match="exceeds container_count"):
        Settings(processes=5)
    with pytest.raises(InvalidArgument, match="each process a cluster member: set node_id"):
        Settings(processes=2, tier1="s3://b/t1", tier2="s3://b/t2")
    on_s3 = Settings(processes=2, tier1="s3://b/t1", tier2="s3://b/t2", node_id="a", advertise_url="http://h:1")
    assert on_s3.local_members and on_s3.processes_to_start(8) == 2
