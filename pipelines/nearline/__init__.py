"""The nearline tier: a Kafka consumer group with RocksDB state per partition (see runner)."""
