"""Optional fluent answers from any OpenAI-compatible chat endpoint (vLLM, Ollama, llama.cpp
server, Azure OpenAI, Groq), never at the price of an uncited claim.

Two stages over the retrieved evidence: the model first selects the evidence ids that matter,
then writes statements as JSON `[{"statement": ..., "citations": [ids]}]` from the selected
evidence only. Output is parsed strictly; malformed output gets one repair request, then the
extractive answer stands. Every statement is verified against the evidence it cites
(search.verify) and removed if unsupported. Identifiers are scrubbed from everything sent.
"""
from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass

import requests

from search.answering.phi import Identifiers, scrub

log = logging.getLogger(__name__)

RULES = (
    "You answer a clinician's question about one patient using ONLY the numbered evidence from the "
    "patient's record. Rules: use only the evidence; every statement must cite the evidence ids it "
    "comes from; do not give treatment advice beyond what the record states; no statistics, no "
    "'studies show', no general knowledge; if the evidence is insufficient, return an empty list.")
GENERAL_RULES = (
    "You answer a general clinical knowledge question from a clinician. Be brief and factual, say "
    "when something depends on the patient or on local guidance, and do not invent statistics. "
    "Do not discuss any specific patient.")


# What a clinician reads when a configured model could not write the answer: the answer that
# follows is chartcite's own, taken from the record.
UNAVAILABLE = "The language model is unavailable; this answer is taken from the record without it."


class LlmError(RuntimeError):
    pass


@dataclass
class LlmSettings:
    url: str                 # base URL of the OpenAI-compatible API, e.g. http://127.0.0.1:8080/v1
    model: str
    api_key: str = ""
    timeout: float = 60.0
    max_tokens: int = 512
    # After a model server has failed to answer (down, dead, or silent past the timeout), questions
    # go without it for this long rather than each waiting out the timeout again.
    rest_seconds: float = 30.0


CONNECT_SECONDS = 5.0    # a server that is up accepts at once; a dead one refuses at once


class ChatClient:
    # Structured output: OpenAI's json_schema form (OpenAI, Azure, vLLM, Groq, Ollama); servers
    # that only know json_object take the schema inside it (llama-cpp-python's server).
    SCHEMA_FORMS = ("json_schema", "json_object")

    def __init__(self, settings: LlmSettings):
        self.settings = settings
        self.http = requests.Session()
        self.schema_form = self.SCHEMA_FORMS[0]
        self.resting_until = 0.0

    @property
    def name(self) -> str:
        return self.settings.model

    def _response_format(self, schema: dict) -> dict:
        if self.schema_form == "json_schema":
            return {"type": "json_schema", "json_schema": {"name": "chartcite", "schema": schema, "strict": True}}
        return {"type": "json_object", "schema": schema}

    def complete(self, messages: list[dict], max_tokens: int | None = None, schema: dict | None = None) -> str:
        headers = {"Content-Type": "application/json"}
        if self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key}"
        body = {"model": self.settings.model, "messages": messages, "temperature": 0,
                "max_tokens": max_tokens or self.settings.max_tokens}
        if schema is not None:
            body["response_format"] = self._response_format(schema)
        response = self._post(body, headers)
        if schema is not None and response.status_code in (400, 422, 500) and "response_format" in response.text \
                and self.schema_form == self.SCHEMA_FORMS[0]:
            self.schema_form = self.SCHEMA_FORMS[1]
            body["response_format"] = self._response_format(schema)
            response = self._post(body, headers)
        if response.status_code != 200:
            raise LlmError(f"the language model answered {response.status_code}")
        try:
            return response.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise LlmError("the language model's response is not a chat completion") from exc

    def _post(self, body: dict, headers: dict) -> requests.Response:
        if time.monotonic() < self.resting_until:
            raise LlmError("the language model failed moments ago; not asked again yet")
        try:
            return self.http.post(self.settings.url.rstrip("/") + "/chat/completions", json=body, headers=headers,
                                  timeout=(min(CONNECT_SECONDS, self.settings.timeout), self.settings.timeout))
        except requests.RequestException as exc:
            self.resting_until = time.monotonic() + self.settings.rest_seconds
            raise LlmError(f"the language model is unreachable ({type(exc).__name__})") from exc


# --- strict parsing -------------------------------------------------------------------------------

def _json_block(text: str) -> str:
    """The JSON the model wrote, allowing only a ```json fence around it."""
    text = text.strip()
    fenced = re.fullmatch(r"```(?:json)?\s*(.*?)\s*```", text, flags=re.S)
    return fenced.group(1) if fenced else text


def parse_selection(text: str, allowed: set[int]) -> list[int]:
    data = json.loads(_json_block(text))
    ids = data.get("ids") if isinstance(data, dict) else data
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ValueError('expected {"ids": [integers]}')
    return [i for i in dict.fromkeys(ids) if i in allowed]


def parse_statements(text: str) -> list[dict]:
    data = json.loads(_json_block(text))
    if isinstance(data, dict):
        data = data.get("statements")
    if not isinstance(data, list):
        raise ValueError('expected {"statements": [...]}')
    out = []
    for item in data:
        if not isinstance(item, dict) or not isinstance(item.get("statement"), str):
            raise ValueError('each item needs a "statement" string')
        citations = item.get("citations", [])
        if not isinstance(citations, list) or not all(isinstance(c, int) for c in citations):
            raise ValueError('"citations" must be a list of integers')
        out.append({"statement": item["statement"].strip(), "citations": citations})
    return out


def selection_schema(ids: list[int]) -> dict:
    return {"type": "object", "required": ["ids"], "additionalProperties": False,
            "properties": {"ids": {"type": "array", "items": {"type": "integer", "enum": ids}, "maxItems": len(ids)}}}


def statements_schema(ids: list[int]) -> dict:
    return {"type": "object", "required": ["statements"], "additionalProperties": False, "properties": {
        "statements": {"type": "array", "maxItems": 4, "items": {
            "type": "object", "required": ["statement", "citations"], "additionalProperties": False, "properties": {
                "statement": {"type": "string", "maxLength": 400},
                "citations": {"type": "array", "items": {"type": "integer", "enum": ids}, "minItems": 1, "maxItems": 3},
            }}}}}


def ask_json(client: ChatClient, messages: list[dict], parse, schema_hint: str, schema: dict | None = None):
    """One request, and on malformed output one repair request; None when both fail."""
    reply = client.complete(messages, schema=schema)
    try:
        return parse(reply)
    except (ValueError, TypeError) as first:
        repair = messages + [{"role": "assistant", "content": reply[:2000]},
                             {"role": "user", "content": f"That was not valid JSON ({first}). Reply with only "
                                                         f"the JSON, exactly in this form: {schema_hint}"}]
        try:
            return parse(client.complete(repair, schema=schema))
        except (ValueError, TypeError):
            return None


# --- the two stages ---------------------------------------------------------------------------------

@dataclass
class Draft:
    statements: list[dict]         # {"statement", "citations": [evidence ids]}
    selected: list[int]


def evidence_block(evidence: list[tuple[int, str, str]], ids: Identifiers) -> str:
    return "\n".join(f"[{i}] {scrub(label, ids)}: {scrub(text, ids)}" for i, label, text in evidence)


WRITE_FOR_CLINICIAN = (
    "Answer in JSON: an object whose key statements is a list; each item has "
    "statement (one sentence, in your words, from the evidence) and citations (the ids "
    "of the evidence it comes from). The first statement answers the question directly "
    "in clinical words: yes or no, the value with its unit and date, or the current "
    "items; at most three short supporting statements follow.")


def generate(client: ChatClient, question: str, evidence: list[tuple[int, str, str]], ids: Identifiers,
             write_instruction: str = WRITE_FOR_CLINICIAN) -> Draft | None:
    """Select, then write (`write_instruction` says how: a clinician's answer by default, a reply
    to a patient from `search.reply`). None when the model's output stays malformed (the caller falls back),
    and at once when there is no evidence: nothing could be cited, and a schema whose id list is
    empty is a grammar with an empty rule, which crashes llama.cpp's server (SIGSEGV)."""
    if not evidence:
        return None
    safe_question = scrub(question, ids)
    allowed = {i for i, _, _ in evidence}
    select_messages = [
        {"role": "system", "content": RULES},
        {"role": "user", "content": f"Question: {safe_question}\n\nEvidence:\n{evidence_block(evidence, ids)}\n\n"
                                    "Which evidence ids are needed to answer? Reply in JSON: an object whose key ids "
                                    "lists those evidence ids."}]
    selected = ask_json(client, select_messages, lambda t: parse_selection(t, allowed), '{"ids": [1, 2]}',
                        selection_schema(sorted(allowed)))
    if selected is None:
        return None
    chosen = [e for e in evidence if e[0] in selected] or evidence
    write_messages = [
        {"role": "system", "content": RULES},
        {"role": "user", "content": f"Question: {safe_question}\n\nEvidence:\n{evidence_block(chosen, ids)}\n\n"
                                    + write_instruction}]
    chosen_ids = [e[0] for e in chosen]
    statements = ask_json(client, write_messages, parse_statements,
                          '{"statements": [{"statement": "...", "citations": [1]}]}', statements_schema(chosen_ids))
    if statements is None:
        return None
    return Draft(statements, chosen_ids)


def general_answer(client: ChatClient, question: str, ids: Identifiers) -> str:
    return client.complete([{"role": "system", "content": GENERAL_RULES},
                            {"role": "user", "content": scrub(question, ids)}]).strip()


# --- is the question about this patient? ---------------------------------------------------------------

_PATIENT_WORDS = re.compile(r"\b(he|she|him|her|his|hers|they|them|their|patient|pt|this person|"
                            r"has|had|was|is (?:he|she|the patient) |did|does (?:he|she)|latest|last|recent|"
                            r"current|ever|history|taking|on any|allerg|visit|note)\b", re.I)
_GENERAL_PHRASES = re.compile(r"\b(normal range|reference range for|side effects? of|symptoms of|signs of|what causes|"
                              r"how does .+ work|mechanism of|(?:usual|typical|standard|maximum|starting|recommended) "
                              r"dose|first[- ]line|guidelines? for|definition of|define|explain)\b", re.I)
# "What is hypertension?" defines; "What is the BMI?" asks for this patient's value.
_DEFINITION = re.compile(r"^\s*what(?: is|'s| are) (?:an? )?(?!the\b|his\b|her\b|their\b|my\b)[\w\s-]+\?*\s*$", re.I)


def is_general_question(question: str, mentions_record: bool, names_measurement: bool = False) -> bool:
    """"What is the normal range for potassium?" is about medicine, not this patient. Anything that
    mentions the patient, their record or something their record contains is about the patient.
    Asked inside a chart, "What's A1c?" wants this patient's value, not a definition: a measurement
    has a value, so naming one turns the definition form into a question about the record."""
    if mentions_record or _PATIENT_WORDS.search(question):
        return False
    if _GENERAL_PHRASES.search(question):
        return True
    return bool(_DEFINITION.match(question)) and not names_measurement
