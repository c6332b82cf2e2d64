"""Register the JVM functions the SQL half of the job calls: each source's decode, the dead-letter headers.

Per source, ``hw_decode_<n>`` and ``hw_event_time_<n>`` are instances of ``dev.headwater.flink.DecodeEvent``
and ``EventTime`` (infra/maven/flink-udfs) built with the source's decoder config
(:func:`headwater.pipelines.realtime.decode.decoder_config`): the function instance carries the source's
schemas into the job graph, so a Flink cluster needs no file of the feature repo. The dead-letter headers
are ``dev.headwater.flink.realtime.DlqHeaders`` (counting ``hw_dlq_<reason>``); the rules are tested with
``dev.headwater.flink.IsFalse`` (see :func:`.sql.rule_checks`). The job runs no Python
worker. Imports of pyflink stay inside :func:`register`, so this module loads without Flink.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from headwater.pipelines.realtime.sql import UdfSpec

if TYPE_CHECKING:
    from pyflink.table import StreamTableEnvironment


def register(t_env: StreamTableEnvironment, functions: Sequence[UdfSpec]) -> None:
    """Register ``functions`` (built with their config) and the dead-letter headers function in ``t_env``."""
    from pyflink.java_gateway import get_gateway

    jvm = get_gateway().jvm
    for spec in functions:
        cls: Any = jvm
        for part in spec.java_class.split("."):
            cls = getattr(cls, part)
        t_env._j_tenv.createTemporarySystemFunction(spec.name, cls(spec.config))
    t_env.create_java_temporary_system_function("hw_dlq_headers", "dev.headwater.flink.realtime.DlqHeaders")
    t_env.create_java_temporary_system_function("hw_is_false", "dev.headwater.flink.IsFalse")
