"""The devstack's pure parts: broker and Postgres settings, URLs, the state file, modes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from matcher_devstack import kafka, postgres
from matcher_devstack.procs import DevstackUsageError
from matcher_devstack.stack import (
    Broker,
    Devstack,
    Mode,
    PgNode,
    Ports,
    State,
    default_home,
    new_state,
    project_root,
)


def test_a_cluster_broker_replicates_three_ways_and_needs_two_in_sync(tmp_path: Path) -> None:
    node = kafka.ClusterNode(node_id=2, port=9092)
    props = kafka.cluster_properties(node, tmp_path / "data", controller_port=9093, brokers=3)
    assert props["process.roles"] == "broker"
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == "0@127.0.0.1:9093"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9092"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092"
    for key in (
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "share.coordinator.state.topic.replication.factor",
    ):
        assert props[key] == "3", key
    for key in (
        "min.insync.replicas",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.min.isr",
    ):
        assert props[key] == "2", key
    assert props["log.dirs"] == str((tmp_path / "data").resolve())
    assert props["auto.create.topics.enable"] == "false"


def test_the_cluster_controller_is_a_process_of_its_own(tmp_path: Path) -> None:
    node = kafka.ClusterNode(node_id=kafka.CONTROLLER_NODE_ID, port=9093)
    assert node.is_controller
    props = kafka.cluster_properties(node, tmp_path, controller_port=9093, brokers=3)
    assert props["process.roles"] == "controller"
    assert props["node.id"] == "0"
    assert props["listeners"] == "CONTROLLER://127.0.0.1:9093"
    assert "advertised.listeners" not in props


def test_the_single_node_keeps_its_settings(tmp_path: Path) -> None:
    props = kafka.single_node_properties(tmp_path, port=19092, controller_port=19093)
    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:19093"
    assert props["default.replication.factor"] == "1"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"
    assert "min.insync.replicas" not in props
    rendered = kafka.render_properties(props)
    assert rendered.endswith("\n")
    assert "node.id=1\n" in rendered


def test_the_cluster_id_is_read_back_from_a_formatted_node(tmp_path: Path) -> None:
    paths = kafka.KafkaPaths(home=tmp_path, cache=tmp_path / "cache")
    assert kafka.cluster_id_of(paths) is None
    paths.data.mkdir()
    (paths.data / "meta.properties").write_text("version=1\ncluster.id=-abc_D\nnode.id=2\n")
    assert kafka.cluster_id_of(paths) == "-abc_D"


def test_replication_settings_of_a_primary_and_a_standby() -> None:
    primary = postgres.replication_config(name="pg1", sync_standby="pg2")
    assert "synchronous_standby_names = 'pg2'" in primary
    assert "synchronous_commit = on" in primary
    assert "wal_log_hints = on" in primary
    assert "primary_conninfo" not in primary

    standby = postgres.replication_config(name="pg2", primary_port=5433)
    assert "synchronous_standby_names = ''" in standby
    assert (
        "primary_conninfo = 'host=127.0.0.1 port=5433 user=matcher application_name=pg2'" in standby
    )


def test_the_multi_host_url_names_the_primary_first() -> None:
    assert postgres.multi_host_url([5433, 5434]) == (
        "postgresql://matcher@127.0.0.1:5433,127.0.0.1:5434/matcher?target_session_attrs=read-write"
    )
    assert postgres.url(5433) == "postgresql://matcher@127.0.0.1:5433/matcher"


def test_the_single_stack_state_file_keeps_its_old_shape() -> None:
    old = {"kafka": 1, "kafka_controller": 2, "postgres": 3}
    state = State.from_json(old)
    assert state.mode == Mode()
    assert state.to_json() == old
    assert state.ports() == Ports(1, 2, 3)
    assert state.bootstrap_servers() == "127.0.0.1:1"
    assert state.database_url() == "postgresql://matcher@127.0.0.1:3/matcher"


def test_a_cluster_state_round_trips_and_lists_every_node() -> None:
    state = State(
        Mode(brokers=3, standby=True),
        [Broker(1, 101), Broker(2, 102), Broker(3, 103)],
        100,
        [PgNode(2, 202, "primary"), PgNode(1, 201, "standby")],
    )
    assert State.from_json(json.loads(json.dumps(state.to_json()))) == state
    assert state.bootstrap_servers() == "127.0.0.1:101,127.0.0.1:102,127.0.0.1:103"
    assert state.database_url().startswith("postgresql://matcher@127.0.0.1:202,127.0.0.1:201/")
    assert state.primary.name == "pg2"
    assert state.ports() == Ports(101, 100, 202)


def test_new_state_chooses_distinct_ports() -> None:
    state = new_state(Mode(brokers=3, standby=True))
    ports = [b.port for b in state.brokers] + [n.port for n in state.postgres]
    ports.append(state.controller_port)
    assert len(set(ports)) == 6
    assert [n.role for n in state.postgres] == ["primary", "standby"]
    assert [b.node_id for b in state.brokers] == [1, 2, 3]


def test_mode_flags_and_description() -> None:
    assert Mode().flags() == ""
    assert Mode(3, True).flags() == "--brokers 3 --standby"
    assert Mode(1, True).flags() == "--standby"
    assert Mode(3, False).describe() == "3 Kafka brokers and one Postgres"


def test_asking_another_mode_than_the_data_has_is_refused(tmp_path: Path) -> None:
    stack = Devstack(home=tmp_path, cache=tmp_path / "cache")
    assert stack._resolve_mode(None, None) == Mode()
    assert stack._resolve_mode(3, True) == Mode(3, True)

    stack._save(State.from_json({"kafka": 1, "kafka_controller": 2, "postgres": 3}))
    assert stack._resolve_mode(None, None) == Mode()
    with pytest.raises(DevstackUsageError, match=r"up --fresh --brokers 3`.*down --purge"):
        stack._resolve_mode(3, None)
    assert stack._resolve_mode(3, None, check=False) == Mode(3, False)

    stack._save(new_state(Mode(3, True)))
    assert stack._resolve_mode(None, None) == Mode(3, True)  # remembered
    with pytest.raises(DevstackUsageError, match="--brokers 3`"):
        stack._resolve_mode(None, False)
    with pytest.raises(DevstackUsageError, match="1 or 3 brokers"):
        stack._resolve_mode(2, None)


def test_without_a_state_file_the_data_tells_the_mode(tmp_path: Path) -> None:
    stack = Devstack(home=tmp_path, cache=tmp_path / "cache")
    (tmp_path / "kafka" / "data").mkdir(parents=True)
    (tmp_path / "kafka" / "data" / "meta.properties").write_text("cluster.id=x\n")
    assert stack._data_mode() == (1, None)
    with pytest.raises(DevstackUsageError):
        stack._resolve_mode(3, None)
    assert stack._resolve_mode(None, True) == Mode(1, True)  # no Postgres data yet


def test_a_subprojects_pyproject_is_not_the_project_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test fixtures and the CLI find the same root: matcher's, not producers/python's."""
    monkeypatch.delenv("MATCHER_DEVSTACK_DIR", raising=False)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "matcher"\n')
    sub = tmp_path / "producers" / "python"
    sub.mkdir(parents=True)
    (sub / "pyproject.toml").write_text('[project]\nname = "matcher-producer"\n')
    assert project_root(sub) == tmp_path.resolve()
    assert default_home(sub) == tmp_path.resolve() / ".devstack"


def test_a_stack_above_a_checkout_is_not_the_checkouts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MATCHER_DEVSTACK_DIR", raising=False)
    (tmp_path / ".devstack").mkdir()
    clone = tmp_path / "clone"
    (clone / ".git").mkdir(parents=True)
    (clone / "docs").mkdir()
    assert default_home(clone / "docs") == clone.resolve() / ".devstack"
    assert default_home(tmp_path / "clone-less") == tmp_path.resolve() / ".devstack"
    monkeypatch.setenv("MATCHER_DEVSTACK_DIR", str(tmp_path / "chosen"))
    assert default_home(clone) == (tmp_path / "chosen").resolve()
