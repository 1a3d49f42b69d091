"""The declared shape of every JSON request body, checked before a route reads it.

A body of the wrong shape (a list, a string, `k: 1e400`, a draft without its title) is answered
400 with a sentence a person understands, never 500.
"""
from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from flask import abort, jsonify, make_response, request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from search.nlp.lexicon import clean_text

PIPELINES = ("dense", "hybrid", "full")
Model = TypeVar("Model", bound=BaseModel)


class Body(BaseModel):
    # Unknown keys are ignored (newer frames may send more); a patient key is checked by the route.
    model_config = ConfigDict(extra="ignore")


def _clean_if_text(value):
    return clean_text(value) if isinstance(value, str) else value


class AskBody(Body):
    question: Annotated[str, BeforeValidator(_clean_if_text)] = Field(min_length=1, max_length=1000)
    pipeline: Literal["dense", "hybrid", "full"] = "full"
    k: int = Field(default=5, ge=1, le=20)


class DraftBody(Body):
    kind: str


class SimilarBody(Body):
    k: int = Field(default=5, ge=1, le=20)


class CohortBody(Body):
    condition: Annotated[str, BeforeValidator(_clean_if_text)] = Field(min_length=1, max_length=200)
    exposures: list[Annotated[str, BeforeValidator(_clean_if_text)]] = Field(min_length=2, max_length=6)
    outcome: Annotated[str, BeforeValidator(_clean_if_text)] = Field(min_length=1, max_length=100)
    window_months: int = Field(default=12, ge=1, le=120)


class DraftLine(Body):
    text: str = Field(max_length=2000)
    citations: list[int] = Field(min_length=1)


class DraftSection(Body):
    title: str = Field(max_length=200)
    lines: list[DraftLine] = Field(max_length=500)


class DraftCitation(Body):
    n: int
    ref: str = Field(max_length=200)
    label: str = Field(default="", max_length=500)


class Draft(Body):
    kind: str
    title: str = Field(max_length=200)
    sections: list[DraftSection] = Field(max_length=20)
    citations: list[DraftCitation] = Field(max_length=500)


class SaveDraftBody(Body):
    draft: Draft


class WriteBackBody(Body):
    saved: str = Field(min_length=1, max_length=40)   # the saved entry's audit ref


class SyncBody(Body):
    pass


def json_object() -> dict:
    """The request's JSON body as an object ({} when there is none); anything else is a 400."""
    if not request.get_data(cache=True):
        return {}
    payload = request.get_json(silent=True, force=True)
    if not isinstance(payload, dict):
        refuse("the request body must be a JSON object")
    return payload


def parse(model: type[Model], payload: dict) -> Model:
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        refuse(describe(exc))


def describe(exc: ValidationError) -> str:
    """The first problem, said plainly: 'k: Input should be less than or equal to 20'."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg", "invalid request"))


def refuse(message: str):
    abort(make_response(jsonify(error=message), 400))

