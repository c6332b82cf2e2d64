"""The offline tier: Kafka events landed in Delta, Spark feature tables, training sets, materialization.

- :mod:`.landing`: ``events`` -> bronze Delta table (partitioned by date), exactly once: the Kafka
  offsets travel in the same Delta commit as the rows (:mod:`.landing_state`); records decoded a
  poll at a time into Arrow (:mod:`.landing_batch`), optionally by reader processes
  (:mod:`.landing_workers`); malformed, future-dated and late events to the DLQ.
- :mod:`.aggregate` and :mod:`.job`: one Spark job per view of a tier plan, the window semantics
  of ``WINDOWS.md`` computed per daily boundary, written to Delta partitioned by date and
  Z-ordered by entity id.
- :mod:`.labels`: ranker labels from bronze (impression clicked within a horizon; slate = page).
- :mod:`.training`: point-in-time training sets (as-of join, never a future value).
- :mod:`.materialize`: latest offline values -> the online store.
- :mod:`.consistency`: online values checked against an offline recomputation.
"""
