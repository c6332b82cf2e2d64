"""The HTTP contract of ``/v1/rank`` and the translation of validation errors into readable messages."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_CANDIDATES = 2000
MAX_RECOMMEND_K = 200
MAX_ID_LENGTH = 128
MAX_DEADLINE_MS = 10_000.0
Priority = Literal["high", "normal", "low"]
Device = Literal["ios", "android", "web"]
FeedbackType = Literal["click", "like", "purchase", "dwell"]
MAX_FEEDBACK_AGE_S = 60.0
MAX_FEEDBACK_SKEW_S = 5.0
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,128}$"
"""An idempotency key: 1 to 128 printable ASCII characters without spaces (a UUID fits)."""
_FIELD_PREFIX = re.compile(r"^(\w+): (.*)$", re.DOTALL)


class RequestOptions(BaseModel):
    """What a rank and a recommend request share: the user, admission, and the impressions sent back."""

    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH, examples=["u000042"])
    priority: Priority = "normal"
    deadline_ms: float | None = Field(default=None, gt=0.0, le=MAX_DEADLINE_MS)
    session_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    """Session of the impressions sent back to Kafka (default: the request id)."""
    device: Device = "web"
    log_impressions: bool = True
    """Send the answer's items back to Kafka as impression events (the feedback loop); recommend also
    remembers them for the seen filter."""
    user_class: str | None = Field(default=None, min_length=1, max_length=64, examples=["vip"])
    """The caller's class for admission (serving config ``admission``; an ``X-User-Class`` header wins);
    one the config does not list is its default class (``regular``)."""


OPTION_FIELDS = tuple(name for name in RequestOptions.model_fields if name != "user_id")
"""The optional fields of both requests (the gRPC messages mark them ``optional``: absent is the default)."""


class RankRequest(RequestOptions):
    """Rank ``candidates`` for ``user_id`` and return the best ``k``."""

    candidates: list[str] = Field(
        min_length=1,
        max_length=MAX_CANDIDATES,
        examples=[["i000001", "i000002"]],
        # What ``_ids`` checks, in the published schema (clients and fuzzers see the real contract).
        json_schema_extra={
            "items": {"type": "string", "minLength": 1, "maxLength": MAX_ID_LENGTH},
            "uniqueItems": True,
        },
    )
    k: int = Field(ge=1, le=MAX_CANDIDATES, examples=[10])

    @field_validator("candidates")
    @classmethod
    def _ids(cls, value: list[str]) -> list[str]:
        lengths = list(map(len, value))
        if value and min(lengths) >= 1 and max(lengths) <= MAX_ID_LENGTH and len(set(value)) == len(value):
            return value  # the common case, checked in C; the loop below names the offender
        seen: set[str] = set()
        for i, item in enumerate(value):
            if not item or len(item) > MAX_ID_LENGTH:
                msg = f"item ids must be 1 to {MAX_ID_LENGTH} characters; candidates[{i}] has {len(item)}"
                raise ValueError(msg)
            if item in seen:
                msg = f"item ids must be unique; {item!r} appears more than once"
                raise ValueError(msg)
            seen.add(item)
        return value

    @model_validator(mode="after")
    def _k_within_candidates(self) -> RankRequest:
        if self.k > len(self.candidates):
            msg = f"k: must be between 1 and the number of candidates ({len(self.candidates)}); got {self.k}"
            raise ValueError(msg)
        return self


class RecommendRequest(RequestOptions):
    """Recommend ``k`` items for ``user_id`` from the whole catalog (the funnel)."""

    k: int = Field(ge=1, le=MAX_RECOMMEND_K, examples=[10])


class StageOut(BaseModel):
    """One funnel stage of one answer."""

    stage: Literal["retrieve", "seen", "rank", "rerank", "rules"]
    ms: float
    candidates: int = Field(description="Candidates the stage passed on.")
    fallback: str | None
    fallback_reason: str | None


class RecommendedItem(BaseModel):
    """One recommended item: the last model's score (null for a pin no model scored), its category."""

    item_id: str
    score: float | None
    category: str | None


class RecommendResponse(BaseModel):
    """Top-k items of the funnel, best first, with each stage's time, candidates and fallback."""

    items: list[RecommendedItem]
    stages: list[StageOut]
    fallback: bool = Field(description="True when any stage fell back.")
    model_version: str | None
    reranker_version: str | None
    retrieval_version: str | None
    latency_ms: float
    request_id: str


class FeedbackRequest(BaseModel):
    """A user's reaction to a served item; produced to Kafka as a behaviour event."""

    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH, examples=["u000042"])
    item_id: str = Field(min_length=1, max_length=MAX_ID_LENGTH, examples=["i000001"])
    event_type: FeedbackType
    request_id: str | None = Field(default=None, min_length=1, max_length=64)
    """The ``request_id`` of the ranking that showed the item (links the event to its impression)."""
    position: int | None = Field(default=None, ge=1, le=MAX_CANDIDATES)
    session_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    """Default: the request id, else ``fb-<user_id>``."""
    device: Device = "web"
    category: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    price: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)
    dwell_ms: int | None = Field(default=None, ge=0, le=86_400_000)
    event_time_ms: int | None = Field(default=None, ge=0)
    """Event time (UTC ms); default now. At most ``MAX_FEEDBACK_AGE_S`` old, ``MAX_FEEDBACK_SKEW_S`` ahead."""
    idempotency_key: str | None = Field(default=None, pattern=IDEMPOTENCY_KEY_PATTERN, examples=["7f3c0b9e"])
    """Repeat it on every retry of this post: the retry produces the same event and counts once
    (or send it as the ``Idempotency-Key`` header). The event id is derived from it, never equal to
    it; see ``headwater.serving.feedback`` for the contract across replicas."""

    @model_validator(mode="before")
    @classmethod
    def _no_client_event_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and "event_id" in data:
            msg = (
                "event_id: the service chooses event ids (a client-chosen one could be an impression's);"
                " send idempotency_key (or the Idempotency-Key header) to make retries count once"
            )
            raise ValueError(msg)
        return data

    @model_validator(mode="after")
    def _fields_of_type(self) -> FeedbackRequest:
        if self.event_type == "dwell" and self.dwell_ms is None:
            msg = "dwell_ms: required for a dwell event (milliseconds the item was viewed)"
            raise ValueError(msg)
        if self.event_type != "dwell" and self.dwell_ms is not None:
            msg = f"dwell_ms: only a dwell event has one; got {self.dwell_ms} for a {self.event_type}"
            raise ValueError(msg)
        if self.price is not None and self.event_type != "purchase":
            msg = f"price: only a purchase has one; got {self.price} for a {self.event_type}"
            raise ValueError(msg)
        if self.position is not None and self.request_id is None and self.session_id is None:
            msg = "position: needs the request_id (or session_id) of the ranking that showed the item"
            raise ValueError(msg)
        return self


class FeedbackResponse(BaseModel):
    """The event produced for a feedback post."""

    event_id: str
    event_time_ms: int
    queued: bool = Field(description="False when the buffer to Kafka was full and the event was dropped.")
    replayed: bool = Field(
        default=False,
        description="True when this idempotency key was already accepted: the same event again.",
    )


class ItemScore(BaseModel):
    """One ranked item."""

    item_id: str
    score: float


class FeatureAgesOut(BaseModel):
    """Ages in seconds of the features used (null where none was used)."""

    user: float | None
    items_p50: float | None
    items_max: float | None


class RankResponse(BaseModel):
    """Top-k items, best first."""

    items: list[ItemScore]
    model_version: str | None = Field(
        description="Version of the model that scored; null for popularity/editorial."
    )
    fallback: Literal["linear", "popularity", "editorial"] | None
    fallback_reason: str | None
    feature_ages_s: FeatureAgesOut
    latency_ms: float
    request_id: str = Field(description="Id of this ranking; post feedback on its items with it.")
    user_feature_event_ms: dict[str, int] = Field(
        description="Event time (window boundary, UTC ms) of each user view the answer read."
    )
    arm: str | None = Field(
        default=None, description="The user's experiment arm, `<experiment>/<arm>`; null outside experiments."
    )


class FeedbackStats(BaseModel):
    """Events sent back to Kafka since start."""

    connected: bool
    sent: int
    dropped: int
    failed: int
    buffered: int


class ItemMirrorStats(BaseModel):
    """The item views' rows held in memory for the ranker (serving/item_mirror.py)."""

    items: int
    version: int
    """Bumped by every change of the rows held (a refresh that read changed items, a removal)."""
    age_s: float | None
    """Seconds since memory and store were last confirmed to agree (None: never)."""
    views_from_memory: list[str]
    """Item views served from memory now (the age within their bound); the others are read from Redis."""
    candidates_from_memory: int
    candidates_from_store: int
    """Candidates read from Redis in every item view: not held, or their key expires soon."""


class IndexSnapshotStats(BaseModel):
    """The item index's snapshot on disk (serving/retrieval/snapshot.py)."""

    folder: str
    loaded_version: str | None
    """The index version this process started from (None: built from the store)."""
    loaded_items: int | None
    load_s: float | None
    saved_version: str | None
    """The last index version this process saved (None: none yet)."""
    saved_at_ms: int | None
    save_s: float | None
    save_bytes: int | None
    save_failures: int


class HealthResponse(BaseModel):
    """Service state."""

    status: Literal["ok", "degraded"]
    model_version: str | None
    linear_version: str | None
    registry_version: str | None
    view_versions_changed: list[str] = []
    """Views the model was trained on under another version than the applied one (retrain)."""
    device: str
    ranker_runtime: str | None = None
    """What runs the DCN: ``onnxruntime`` (CPU, when installed) or ``torch``; None without a DCN."""
    ranker_runtime_failures: int = 0
    """Failed ONNX exports or ONNX Runtime calls since start (each such batch was scored by torch)."""
    gpu_memory_used_percent: float | None
    inference_latency_p99_ms: float | None
    feedback: FeedbackStats | None
    retrieval_runtime: str | None = None
    """What embeds the user for retrieval: ``onnxruntime`` or ``torch``; None without a two-tower model."""
    retrieval_runtime_failures: int = 0
    """Failed ONNX exports or calls of the user tower since start (each such user embedded by torch)."""
    retrieval_index: str | None = None
    """What searches the item index: ``usearch-<version>``; None without retrieval."""
    reranker_runtime: str | None = None
    """What runs the funnel's re-ranker: ``onnxruntime`` or ``torch``; None without one."""
    item_mirror: ItemMirrorStats | None = None
    """None: every item view is read from Redis per request (no funnel index, or the mirror is off)."""
    index_snapshot: IndexSnapshotStats | None = None
    """None: the index is neither saved nor loaded (no funnel index, or ``index_snapshot_s`` None)."""


class ErrorResponse(BaseModel):
    """A refused request: one message, and one entry per offending field."""

    detail: str
    errors: list[dict[str, str]] = []


def _field(loc: Sequence[Any]) -> str:
    parts = [p for p in loc if p != "body"]
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def _message(err: dict[str, Any], fields: Sequence[str]) -> str:
    kind, ctx, given = err.get("type", ""), err.get("ctx") or {}, err.get("input")
    shown = repr(given) if len(repr(given)) <= 60 else repr(given)[:57] + "..."
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return f"is not a known field (expected {', '.join(fields)})"
    if kind == "too_long" and "max_length" in ctx:
        return f"must hold at most {ctx['max_length']} entries; got {ctx.get('actual_length')}"
    if kind == "too_short" and "min_length" in ctx:
        return f"must hold at least {ctx['min_length']} entries; got {ctx.get('actual_length')}"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters; got {len(str(given))}"
    if kind == "string_too_short":
        return f"must be at least {ctx.get('min_length')} characters; got an empty string"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        return f"{str(err['msg']).replace('Input should', 'must')}; got {shown}"
    if kind == "literal_error":
        return f"{str(err['msg']).replace('Input should', 'must')}; got {shown}"
    if kind == "json_invalid":
        return f"the body is not valid JSON ({ctx.get('error', 'parse error')})"
    if kind == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    return f"{str(err['msg']).replace('Input should', 'must')}; got {shown}"


def known_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """Return a request model's fields as errors list them: the required ones first, in declaration order."""
    fields = model.model_fields
    return tuple(sorted(fields, key=lambda name: not fields[name].is_required()))


def readable_errors(errors: Sequence[Any], fields: Sequence[str] = ()) -> list[dict[str, str]]:
    """One ``{"field", "message"}`` per pydantic/FastAPI validation error (``fields``: the known ones)."""
    out = []
    for err in errors:
        field, message = _field(err.get("loc", ())), _message(err, fields or known_fields(RankRequest))
        match = _FIELD_PREFIX.match(message)
        if field == "body" and match:
            field, message = match.group(1), match.group(2)
        out.append({"field": field, "message": message})
    return out


class RankedItemAnswer(TypedDict):
    """One ranked item of :class:`RankAnswer` (the dict form of :class:`ItemScore`)."""

    item_id: str
    score: float


class FeatureAgesAnswer(TypedDict):
    """The feature ages of :class:`RankAnswer` (the dict form of :class:`FeatureAgesOut`)."""

    user: float | None
    items_p50: float | None
    items_max: float | None


class RankAnswer(TypedDict):
    """The service core's rank answer; the fields of :class:`RankResponse`, as a plain dict.

    A TypedDict, not a model: the core builds it once per request, orjson writes it as it is (REST)
    and the gRPC adapter reads its keys, so the hot path validates nothing twice.
    """

    items: list[RankedItemAnswer]
    model_version: str | None
    fallback: str | None
    fallback_reason: str | None
    feature_ages_s: FeatureAgesAnswer
    latency_ms: float
    request_id: str
    user_feature_event_ms: dict[str, int]
    arm: str | None


class RecommendedItemAnswer(TypedDict):
    """One item of :class:`RecommendAnswer` (the dict form of :class:`RecommendedItem`)."""

    item_id: str
    score: float | None
    category: str | None


class StageAnswer(TypedDict):
    """One funnel stage of :class:`RecommendAnswer` (the dict form of :class:`StageOut`)."""

    stage: str
    ms: float
    candidates: int
    fallback: str | None
    fallback_reason: str | None


class RecommendAnswer(TypedDict):
    """The service core's recommend answer; the fields of :class:`RecommendResponse`, as a plain dict."""

    items: list[RecommendedItemAnswer]
    stages: list[StageAnswer]
    fallback: bool
    model_version: str | None
    reranker_version: str | None
    retrieval_version: str | None
    latency_ms: float
    request_id: str


class FeedbackAnswer(TypedDict):
    """The service core's feedback answer; the fields of :class:`FeedbackResponse`, as a plain dict."""

    event_id: str
    event_time_ms: int
    queued: bool
    replayed: bool
