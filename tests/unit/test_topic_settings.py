"""Topic settings from ``topics:`` in kmq.yaml (pure parts of kmq.client.topics)."""

from __future__ import annotations

import pytest

from kmq.config import Config
from kmq.core.errors import ConfigError, TopicError
from kmq.client.topics import choose_replication_factor, topic_configs


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
    ({"markers_retention": "30m"}, "topics.markers_retention", "at least 1h"),
    ({"replication_factor": 0}, "topics.replication_factor", "at least 1"),
    ({"dlq_retention": "forever"}, "topics.dlq_retention", "expected a duration"),
])
def test_bad_topic_settings_name_the_key(topics, path, text):
    with pytest.raises(ConfigError) as err:
        Config.from_dict({"topics": topics})
    assert err.value.path == path and text in str(err.value)


def test_one_markers_retention_queues_inherit_topics_and_may_override_it():
    cfg = Config.from_dict({"topics": {"markers_retention": "14d"},
                            "queues": ["a", {"name": "b", "markers_retention": "2d"}]})
    assert cfg.queue("a").markers_retention == 14 * 86400 and cfg.queue("b").markers_retention == 2 * 86400
    assert cfg.queue("unlisted").markers_retention == 14 * 86400  # kmq topics create unlisted
    # kmq topics create sets what the bounds and the tracker's retention ratio assume.
    assert topic_configs(cfg.topics, cfg.queue("a"))["markers"]["retention.ms"] == str(14 * 86400_000)
    assert topic_configs(cfg.topics, cfg.queue("b"))["markers"]["retention.ms"] == str(2 * 86400_000)
    assert Config.from_dict(cfg.to_dict()).queue("b").markers_retention == 2 * 86400


@pytest.mark.parametrize("data, path, key", [
    ({"topics": {"markers_retention": "1h"}, "queues": [{"name": "q", "lease": "20m", "backoff": {"max": "20m"}}]},
     "queues[0].lease", "topics.markers_retention"),
    ({"topics": {"markers_retention": "1h"}, "queues": [{"name": "q", "markers_retention": "2h", "lease": "70m"}]},
     "queues[0].lease", "queues[0].markers_retention"),
    ({"topics": {"markers_retention": "1h"}, "consumer": {"max_lease": "40m"}}, "consumer.max_lease", "1h"),
    ({"topics": {"markers_retention": "1h"}, "consumer": {"handoff_lease": "40m"}}, "consumer.handoff_lease", "1h"),
])
def test_bounds_name_the_retention_key_they_came_from(data, path, key):
    with pytest.raises(ConfigError) as err:
        Config.from_dict(data)
    assert err.value.path == path and key in str(err.value)
