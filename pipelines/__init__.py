"""headwater pipelines: the event stream, the three tiers and the shared online store."""
