"""Which sources the event tools work on: the applied plan's, or the example repo's before any apply.

``headwater events produce|tail --source NAME`` and ``headwater topics create`` read the sources of
the applied offline plan (every plan carries all sources, so any tier's would do) from the state
folder that ``headwater apply`` wrote to: ``--state-dir``, else the one every command resolves
(:func:`headwater.registry.plan.default_state_dir`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from headwater.registry.errors import HeadwaterError
from headwater.registry.plans import PlanSource, read_plan

PLAN_TIER = "offline"
"""The tier plan the sources are read from (each plan carries every source of the registry)."""


class SourceError(HeadwaterError, LookupError):
    """No applied plan, or no such source in it; the message says which and what to do."""


def default_state() -> Path:
    """Return the state folder every command resolves when none is given (where ``apply`` writes)."""
    from headwater.registry.plan import default_state_dir

    return default_state_dir()


def applied_sources(state_dir: Path | None = None) -> list[PlanSource]:
    """Return every source of the applied plan under ``state_dir`` (default: :func:`default_state`).

    Raises:
        SourceError: no plan was applied there, or it was written by another plan version.
    """
    try:
        state = state_dir if state_dir is not None else default_state()
    except ValueError as exc:  # the config file in use is invalid: its message names the file and key
        raise SourceError(str(exc)) from exc
    try:
        return list(read_plan(state, PLAN_TIER).sources)
    except (FileNotFoundError, ValueError) as exc:
        msg = f"{exc} (state folder {state}: pass --state-dir or set HEADWATER_STATE_DIR if it is elsewhere)"
        raise SourceError(msg) from exc


def applied_source(name: str, state_dir: Path | None = None) -> PlanSource:
    """Return the applied source ``name``.

    Raises:
        SourceError: no applied plan, or no source of that name in it (the message lists those there).
    """
    sources = applied_sources(state_dir)
    for source in sources:
        if source.name == name:
            return source
    known = ", ".join(sorted(s.name for s in sources)) or "none"
    msg = (
        f"source {name!r} is not in the applied plan (sources: {known}); declare it in sources.yaml "
        "and run `headwater apply`"
    )
    raise SourceError(msg)


def example_sources(repo: Path | None = None) -> list[PlanSource]:
    """Return every source of the example feature repo, compiled as ``apply`` would (no plan needed).

    Raises:
        SourceError: the example repo has a source that does not check.
    """
    from headwater.pipelines.events.schema import example_repo

    return list(_example_sources((repo or example_repo()).resolve()))


@lru_cache(maxsize=4)
def _example_sources(repo: Path) -> tuple[PlanSource, ...]:
    from headwater.registry.load import load_repo
    from headwater.registry.plans import plan_source
    from headwater.registry.sources import check_sources

    loaded = load_repo(repo)
    compiled = check_sources(repo, loaded.sources, loaded.diagnostics)
    if loaded.diagnostics.errors and len(compiled) < len(loaded.sources):
        problems = "; ".join(d.message for d in loaded.diagnostics.errors)
        msg = f"example repo {repo}: a source does not check: {problems}"
        raise SourceError(msg)
    return tuple(plan_source(compiled[name]) for name in sorted(compiled))


def sources_or_examples(state_dir: Path | None = None) -> tuple[list[PlanSource], str | None]:
    """Return the applied sources, else the example repo's with the reason the plan could not be read.

    ``infra/services.sh`` creates the topics before anything is applied: the example repo's
    sources stand in for the plan then, and the reason is None (no plan yet is the normal state
    before the first ``headwater apply``, nothing to warn about). A plan that exists but cannot be
    read (another plan version, an invalid config) is a reason worth showing.
    """
    try:
        return applied_sources(state_dir), None
    except SourceError as exc:
        not_applied_yet = isinstance(exc.__cause__, FileNotFoundError)
        return example_sources(), None if not_applied_yet else str(exc)
