"""The offline tier: Kafka events landed in Delta, Spark feature tables, training sets, materialization.

- :mod:`.landing`: every source's topic -> its own bronze Delta table ``bronze/<source>`` (columns
  from its schema, :mod:`.source_columns`; partitioned by the date of its event time), exactly once:
  the Kafka offsets travel in the same Delta commit as the rows (:mod:`.landing_state`); records
  decoded with the source's codec a poll at a time into Arrow (:mod:`.landing_batch`), optionally by
  reader processes (:mod:`.landing_workers`); malformed, future-dated and late events to the DLQ.
- :mod:`.history`: a history file of any age and order straight into a source's bronze table,
  exactly once (``headwater events import``, :mod:`headwater.cli.events_import`).
- :mod:`.aggregate` and :mod:`.job`: one Spark job per view of a tier plan over its own source's
  bronze table, the window semantics of ``docs/concepts/windows.md`` computed per daily boundary,
  written to Delta partitioned by date and Z-ordered by entity id.
- :mod:`.labels`: ranker labels from the behaviour source's bronze table (impression clicked within a
  horizon; slate = page).
- point-in-time training sets (as-of join, never a future value) are built on these tables by
  :mod:`headwater.ranking.training_set`.
- :mod:`.materialize`: latest offline values -> the online store.
- :mod:`.consistency`: online values checked against an offline recomputation.
"""
