"""Topic settings from ``topics:`` in kmq.yaml (pure parts of kmq.topics)."""

from __future__ import annotations

import pytest

from kmq.config import Config
from kmq.errors import ConfigError, TopicError
from kmq.topics import choose_replication_factor, topic_configs


@pytest.mark.parametrize("brokers, expected", [(1, 1), (2, 2), (3, 3), (5, 3), (0, 3)])
def test_default_replication_factor_is_3_when_the_cluster_has_3_brokers_else_what_it_has(brokers, expected):
    # 0: the broker count is unknown (DescribeCluster refused): try the production default.
    assert choose_replication_factor(None, brokers) == expected


def test_requested_replication_factor_is_kept_and_checked_against_the_brokers():
    assert choose_replication_factor(2, 3) == 2
    with pytest.raises(TopicError, match="replication factor 4 is above the 3 broker"):
        choose_replication_factor(4, 3)


def test_topic_configs_by_role():
    cfg = Config.from_dict({"topics": {"min_insync_replicas": 2, "markers_retention": "14d", "dlq_retention": "30d",
                                       "replication_factor": 3}})
    assert topic_configs(cfg.topics) == {
        "queue": {"min.insync.replicas": "2"},
        "markers": {"min.insync.replicas": "2", "retention.ms": str(14 * 86400_000)},
        "dlq": {"min.insync.replicas": "2", "retention.ms": str(30 * 86400_000)},
    }
    assert topic_configs(Config().topics) == {"queue": {}, "markers": {"retention.ms": str(7 * 86400_000)}, "dlq": {}}
    assert cfg.to_dict()["topics"] == {"replication_factor": 3, "min_insync_replicas": 2, "markers_retention": "14d",
                                       "dlq_retention": "30d"}


@pytest.mark.parametrize("topics, path, text", [
    ({"min_insync_replicas": 3, "replication_factor": 2}, "topics.min_insync_replicas", "must not exceed"),
    ({"markers_retention": "30s"}, "topics.markers_retention", "at least 1m"),
    ({"replication_factor": 0}, "topics.replication_factor", "at least 1"),
    ({"dlq_retention": "forever"}, "topics.dlq_retention", "expected a duration"),
])
def test_bad_topic_settings_name_the_key(topics, path, text):
    with pytest.raises(ConfigError) as err:
        Config.from_dict({"topics": topics})
    assert err.value.path == path and text in str(err.value)
