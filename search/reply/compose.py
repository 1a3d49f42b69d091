"""A reply draft for a patient's portal message, grounded sentence by sentence.

For each question of the message: the answer pipeline retrieves and judges whether the record
answers it (the same abstention rules as `chartcite ask`); the note sentences of the evidence are
ranked (`search.answering.notes.rank_note_sentences`: similarity to the question, its words, the
section asked, ConText, laterality) and the coded records the answer cites are scored by their
similarity to the question. The best few become the evidence; the draft quotes them, each sentence
citing its own, in the second person, with plain names beside clinical terms. A question the
record cannot answer gets "I will check with your care team" and is listed as unanswered: the
draft never guesses, advises or diagnoses beyond the quoted record.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from search.answering.notes import note_header, rank_note_sentences
from search.answering.phi import Identifiers, scrub
from search.answering.flow import asks_about_medicine, decide
from search.answering.verify import verify_statement
from search.models.llm import LlmError, generate
from search.nlp.lexicon import STOP_WORDS
from search.nlp.vocabulary import names_a_clinical_thing, presence_prefix
from search.retrieval.analysis import patient_terms
from search.retrieval.pipeline import retrieve

from .answer_types import WHY, answer_type_bonus, has_asked_content, required, wanted
from .asked import missing_thing
from .message import about_whom, asks_to_name_what_happens_now, questions_in
from .plain import clinical_reading, glosses
from .urgent import urgent_signs

DEFAULT_WORDS = 75
DEFAULT_URGENT_TEXT = ("If this is happening now, call 911 or go to the nearest emergency department. "
                       "Do not wait for a reply to this message.")
# How the model writes a reply: whole sentences to the patient (the clinician's instruction asks for
# "yes or no" first, which a small model writes as a bare "Yes" that verification must remove).
WRITE_FOR_PATIENT = (
    "Answer in JSON: an object whose key statements is a list; each item has statement (one whole "
    "sentence written to the patient, saying you or your, in plain words, telling what the evidence "
    "says, with its value and date when it has them) and citations (the ids of the evidence it comes "
    "from). No advice, no diagnosis, nothing the evidence does not say; at most three statements.")
CHECK_WITH_CARE_TEAM = "I will check with your care team about your question: “{question}”"
MIN_SCORE = 0.45         # a best sentence the answer did not quote, scoring below this, does not answer
WITHIN = 0.06            # further sentences are kept when nearly as good as the best...
MOST_PER_QUESTION = 2    # ...up to this many per question
QUOTED_BONUS = 0.1       # a sentence the answer pipeline chose to quote
MOST_GLOSSES = 2         # plain names per draft: more would make it long
SIDES = {"left": "right", "right": "left"}
# The words a sentence gives a reason with.
REASON = re.compile(r"\b(?:because|due to|secondary to|given (?:his|her|the|their)|in light of|owing to|as a result|"
                    r"therefore|reason|risky|risk of|need for|in order to|so that|for (?:further|continued|possible))\b",
                    re.I)
REASON_BONUS = 0.12
KIND_OF = re.compile(r"\b(?:what|which) (?:kinds?|types?|sorts?) of\b", re.I)
SITUATION = re.compile(r"\(situation\)\s*$", re.I)      # SNOMED's tag for "History of ..." statements
ABSTAINED = "the record holds no evidence for it"
PLACEHOLDER = re.compile(r"\s*\[(?:redacted|birth date|phone|email|name)\]")
# Coded records a draft may quote (a visit's own line says nothing a patient asked).
CODED_TYPES = ("Condition", "MedicationRequest", "MedicationStatement", "AllergyIntolerance", "Observation",
               "Procedure", "Immunization")


@dataclass
class Evidence:
    """One evidence sentence: a note's sentence or a coded record's line, with its score."""
    n: int
    ref: str
    text: str
    score: float
    question: int                      # which question (0-based) it answers
    date: str = ""
    label: str = ""
    kind: str = "note"                 # note | coded
    span: list[int] | None = None      # [start, end) of the sentence in the indexed note text
    chunk: object = field(default=None, repr=False)
    cited: bool = False                # the answer pipeline cites it (its support judged), whatever its score

    def to_dict(self) -> dict:
        return {"n": self.n, "ref": self.ref, "text": self.text, "span": self.span, "score": round(self.score, 3),
                "kind": self.kind, "date": self.date, "label": self.label, "question": self.question}


@dataclass
class Found:
    """What the record holds for one question of the message."""
    question: str
    evidence: list[Evidence]
    reason: str = ""                   # why it is unanswered, when it is


def questions_and_evidence(svc, tenant: str, patient_id: str, message: str, k: int = 5) -> list[Found]:
    found = []
    for i, (asked, read) in enumerate(questions_in(message)):
        # The patient's lay words are read as the record's clinical terms too ("doesn't reject it").
        result = evidence_for(svc, tenant, patient_id, clinical_reading(read), i, k)
        if not result.evidence and result.reason == ABSTAINED and read != asked:
            # The context can mislead the pipeline as it can help ("I'm still confused about my ER
            # visit..."): the question is read once more as asked, under the same rules.
            result = evidence_for(svc, tenant, patient_id, clinical_reading(asked), i, k)
        found.append(replace(result, question=asked))
    return found


def evidence_for(svc, tenant: str, patient_id: str, question: str, index: int, k: int = 5) -> Found:
    if asks_to_name_what_happens_now(asked_part(question)):
        return Found(question, [], "it asks what is happening now, which only the care team can judge")
    retrieval = retrieve(svc.backend, svc.embedder, question, tenant, patient_id, k=k, pipeline="full",
                         reranker=svc.reranker)
    analysis = retrieval.analysis
    if analysis.impossible_dates:
        return Found(question, [], "names a date that cannot be")
    if asks_about_medicine(retrieval):
        return Found(question, [], "a general medical question, not one about the record")
    retrieval.similarity = svc.similarity_to(question)
    # The answer plan after its openings (search/answering/flow.py): the reasons above are the reply's own.
    answer = decide(svc.answer_context(tenant, patient_id, retrieval, False), openings=())
    if answer.abstained:
        return Found(question, [], ABSTAINED)
    if retrieval.absent_terms:
        return Found(question, [], "the record never names " + ", ".join(sorted(retrieval.absent_terms)))
    absent = absent_concepts(svc, tenant, patient_id, analysis)
    if absent:
        return Found(question, [], "the record never names " + ", ".join(absent))
    scored = scored_sentences(retrieval, answer, analysis)
    scored = same_side(scored, question)
    scored = with_asked_content(scored, required(asked_part(question)))
    scored = naming_what_is_asked(scored, analysis, required(asked_part(question)))
    scored = the_specific_kind(scored, analysis, asked_part(question))
    scored = without_unrelated_weak_records(scored, analysis)
    chosen = chosen_evidence(scored)
    if not chosen:
        return Found(question, [], "no sentence of the record answers it closely enough")
    # The note's own title counts: a sentence of the "Carotid Duplex Ultrasound" report is its finding.
    missing = missing_thing(question, [e.text for e in chosen] + [note_header(e.chunk) for e in chosen if e.chunk])
    if missing:
        return Found(question, [], f"the evidence never names {missing}")
    return Found(question, [replace(e, question=index) for e in chosen])


def absent_concepts(svc, tenant: str, patient_id: str, analysis) -> list[str]:
    """The concepts the message names (not a class: "blood thinner") that the patient's record
    names nowhere, neither as the message wrote them nor by their name, nor in its codings. The
    answer pipeline judges a message's wider words and may let a nearby fact through ("planning
    another pregnancy. Did I get my Tdap shot?" answered from "Postdates pregnancy."); a reply
    to a patient does not."""
    coded = {t.key for t in patient_terms(svc.backend, tenant, patient_id)}
    forms: dict[str, list[list[str]]] = {}
    for c in analysis.concepts:
        written = [c.get("text") or "", c.get("display") or ""]
        # Only a concept written in words no everyday English uses ("Tdap", "Lovenox"): "shots",
        # "heart attack" or "confused" may be what the record says in its own words.
        technical = any(names_a_clinical_thing(w) for w in re.findall(r"[a-z0-9]{2,}", written[0].lower()))
        if c.get("role") == "class" or c.get("key") in coded or not technical:
            continue
        probes = [[presence_prefix(w) for w in re.findall(r"[a-z0-9]{2,}", f.lower()) if w not in STOP_WORDS]
                  for f in written]
        forms[c.get("display") or c.get("text") or "?"] = [p for p in probes if p]
    wanted = sorted({t for probes in forms.values() for form in probes for t in form})
    if not wanted:
        return []
    present = svc.catalog.has_terms(tenant, patient_id, wanted, prefix=True)
    return [name for name, probes in forms.items() if probes and not any(all(t in present for t in p) for p in probes)]


def scored_sentences(retrieval, answer, analysis) -> list[Evidence]:
    """Every note sentence of the evidence, and every coded record the answer cites, scored."""
    quoted = {" ".join(q.split()) for c in answer.citations for q in c.quotes}
    why = bool(WHY.search(retrieval.question))
    kinds = wanted(asked_part(retrieval.question))
    out = []
    for r in rank_note_sentences(analysis, retrieval.evidence, retrieval.similarity):
        chunk = r.ev.chunk
        bonus = QUOTED_BONUS if r.sentence.text in quoted else 0.0
        # "Why did they...?" is answered by a sentence that gives a reason.
        reason = REASON_BONUS if why and REASON.search(r.sentence.text) else 0.0
        reason += answer_type_bonus(kinds, r.sentence.text)
        out.append(Evidence(0, chunk.ref, r.sentence.text, r.score + bonus + reason, 0, chunk.date[:10], chunk.label,
                            "note", span_of(chunk.text, r.sentence.text), chunk, bool(bonus)))
    by_ref = {ev.chunk.ref: ev.chunk for ev in retrieval.evidence}
    coded = [c for c in answer.citations if c.resource_type in CODED_TYPES and c.ref in by_ref]
    if coded and retrieval.similarity is not None:
        lines = [coded_line(by_ref[c.ref]) for c in coded]
        for c, line, sim in zip(coded, lines, retrieval.similarity(lines)):
            # Cited by the answer pipeline, like a quoted note sentence.
            out.append(Evidence(0, c.ref, line, float(sim) + QUOTED_BONUS, 0, c.date, c.label, "coded", None,
                                by_ref[c.ref], True))
    return sorted(out, key=lambda e: e.score, reverse=True)


def asked_part(read: str) -> str:
    """The question itself, without the context read with it (its last sentence)."""
    parts = re.split(r"(?<=[.!?])\s+", read.strip())
    return parts[-1] if parts else read


def coded_line(chunk) -> str:
    """A coded record as one line a patient can read: its first sentence."""
    first = re.split(r"(?<=[.!?])\s+", " ".join(chunk.text.split()), maxsplit=1)[0]
    return first.rstrip(".")


def span_of(text: str, sentence: str) -> list[int] | None:
    """Where the (whitespace-normalised) sentence is in the chunk's text."""
    pattern = r"\s+".join(re.escape(w) for w in sentence.split())
    m = re.search(pattern, text) if pattern else None
    return [m.start(), m.end()] if m else None


def same_side(scored: list[Evidence], question: str) -> list[Evidence]:
    """A question about one side is never answered from a sentence about only the other."""
    asked = {side for side in SIDES if re.search(rf"\b{side}\b", question, re.I)}
    if len(asked) != 1:
        return scored
    side = asked.pop()
    return [e for e in scored if not (re.search(rf"\b{SIDES[side]}\b", e.text, re.I)
                                      and not re.search(rf"\b{side}\b", e.text, re.I))]


def with_asked_content(scored: list[Evidence], kinds: list[str]) -> list[Evidence]:
    """A question that cannot be answered without a kind of content (a side, a number, a time, a
    drug: `answer_types.required`) is not answered by a sentence that lacks it: "Which side was the
    pain on?" by the note's best-matching sentence about the transfer, "Is he on anything for his
    osteoporosis?" by the osteoporosis itself. When something that could answer has the content, the
    rest are left out; when nothing does, only those whose lack is certain are (the patterns read
    sides, numbers and times reliably, a coded record's type says whether it is a drug, but a note
    may name a drug in words no pattern knows), and the usual thresholds decide."""
    if not kinds:
        return scored
    having = {id(e) for e in scored if has_asked_content(kinds, e.text, dated=e.kind == "coded" and bool(e.date),
                                                         medication=e.ref.startswith("Medication") if e.kind == "coded" else None)}
    if any(id(e) in having and (e.score >= MIN_SCORE or e.cited) for e in scored):
        return [e for e in scored if id(e) in having]
    lack_is_certain = [all(k != "medication" or e.kind == "coded" for k in kinds) for e in scored]
    return [e for e, certain in zip(scored, lack_is_certain) if id(e) in having or not certain]


def naming_what_is_asked(scored: list[Evidence], analysis, kinds: list[str]) -> list[Evidence]:
    """A drug question that names its subject ("what medicine is he on for his Alzheimer's?", "is he
    on an anti-rejection drug?") is answered by the medication order whose concepts name it (its
    reason, or its drug's class), not by a note's medication list that scores higher because it
    reads like a list of medicines. When a cited medication record names a concept the question
    asks about (not one of its context), evidence naming neither such a concept nor the drug of
    such a record is left out (a note's list naming the drugs asked for still answers)."""
    asked = {c["key"] for c in analysis.concepts if c.get("role") != "context" and not c.get("negated")}
    if "medication" not in kinds or not asked:
        return scored
    orders = [e for e in scored if e.kind == "coded" and e.cited and e.ref.startswith("Medication")
              and asked & concepts_named(e)]
    if not orders:
        return scored
    drugs = {key for e in orders for key in concepts_named(e, role="member")}
    return [e for e in scored if (asked | drugs) & concepts_named(e)]


def the_specific_kind(scored: list[Evidence], analysis, question: str) -> list[Evidence]:
    """"What kind of heart attack was it?" asks for the disorder itself (the ST-elevation infarction),
    not the record that it happened: a coded SNOMED "(situation)" ("History of myocardial
    infarction") yields to a coded record of another kind naming the same concept."""
    if not KIND_OF.search(question):
        return scored
    asked = {c["key"] for c in analysis.concepts if c.get("role") != "context" and not c.get("negated")}
    coded = [e for e in scored if e.kind == "coded" and asked & concepts_named(e)]
    specific = set().union(*[concepts_named(e) for e in coded if not SITUATION.search(e.text)])
    general = {id(e) for e in coded if SITUATION.search(e.text) and asked & specific & concepts_named(e)}
    return [e for e in scored if id(e) not in general]


def without_unrelated_weak_records(scored: list[Evidence], analysis) -> list[Evidence]:
    """A coded record the answer cites but that scores low and names nothing the message names is
    not an answer ("what was the surgery?" after "I had my tubes tied" is not the year's health
    assessment): the answer pipeline's citation lets a weak record through only when it is about
    what the message is about."""
    named = {c["key"] for c in analysis.concepts if not c.get("negated")}
    if not named:
        return scored
    return [e for e in scored if not (e.kind == "coded" and e.score < MIN_SCORE and not named & concepts_named(e))]


def concepts_named(e: Evidence, role: str | None = None) -> set[str]:
    """The concept keys the evidence names (of that role: "member" for a drug), a coded record's or
    those inside a note sentence's span."""
    concepts = [c for c in (getattr(e.chunk, "concepts", None) or [])
                if not c.get("negated") and (role is None or c.get("role") == role)]
    if e.kind == "coded":
        return {c["key"] for c in concepts}
    if not e.span:
        return set()
    return {c["key"] for c in concepts if "start" in c and e.span[0] <= c["start"] < e.span[1]}


def chosen_evidence(scored: list[Evidence]) -> list[Evidence]:
    # A sentence the answer pipeline quotes has had its support judged; any other must score well.
    if not scored or (scored[0].score < MIN_SCORE and not scored[0].cited):
        return []
    best = scored[0].score
    chosen: list[Evidence] = []
    for e in scored:
        if len(chosen) >= MOST_PER_QUESTION or e.score < best - WITHIN:
            break
        if all(e.text != c.text for c in chosen):
            chosen.append(e)
    return chosen


# --- the draft ----------------------------------------------------------------------------------

@dataclass
class Reply:
    draft: str
    sentences: list[dict]
    evidence: list[Evidence]
    unanswered: list[str]
    urgent: bool
    urgent_signs: list[str]
    questions: list[str]
    generator: str = "extractive"
    removed: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"draft": self.draft, "sentences": self.sentences, "evidence": [e.to_dict() for e in self.evidence],
                "unanswered": self.unanswered, "urgent": self.urgent, "urgent_signs": self.urgent_signs,
                "questions": self.questions, "generator": self.generator, "removed": self.removed,
                "is_draft": True}


def build_reply(svc, tenant: str, patient_id: str, message: str, urgent_text: str = DEFAULT_URGENT_TEXT,
                words: int = DEFAULT_WORDS, k: int = 5, use_llm: bool = True) -> Reply:
    message = " ".join(message.split("\x00"))
    # The patient's own name, birth date, MRN and address are taken out first: they answer nothing,
    # and nothing read from the message may carry them on (to a model, to the audit of the parts).
    ids = Identifiers.from_patient(svc.resource(tenant, patient_id, f"Patient/{patient_id}"))
    message = PLACEHOLDER.sub("", scrub(message, ids))
    found = questions_and_evidence(svc, tenant, patient_id, message, k)
    signs = urgent_signs(message)
    evidence = numbered([e for f in found for e in f.evidence])
    unanswered = [f.question for f in found if not f.evidence]
    whom = about_whom(message)
    sentences = extractive_sentences(evidence, whom, words)
    generator, removed = "extractive", []
    if use_llm and svc.llm is not None and evidence:
        written = model_sentences(svc, tenant, patient_id, found, evidence)
        if written is not None:
            kept, removed = written      # what verification removed is reported even when nothing is kept
            if kept:
                sentences, generator = kept, svc.llm.name
    sentences += [{"text": CHECK_WITH_CARE_TEAM.format(question=shortened(q)), "citations": [], "kind": "unanswered"}
                  for q in unanswered]
    if signs:
        sentences.insert(0, {"text": urgent_text, "citations": [], "kind": "urgent"})
    draft = " ".join(s["text"] + "".join(f" [{n}]" for n in s["citations"]) for s in sentences)
    return Reply(draft, sentences, evidence, unanswered, bool(signs), [s.sign for s in signs],
                 [f.question for f in found], generator, removed)


def numbered(evidence: list[Evidence]) -> list[Evidence]:
    """[1], [2]... in the order the draft cites them; a sentence chosen for two questions once."""
    out, seen = [], {}
    for e in evidence:
        key = (e.ref, e.text)
        if key not in seen:
            seen[key] = len(out) + 1
            out.append(replace(e, n=len(out) + 1))
    return out


def extractive_sentences(evidence: list[Evidence], whom: str, words: int) -> list[dict]:
    """One draft sentence per note (its chosen sentences quoted, each with its mark) and per coded
    record; added best first while the draft stays within `words` (the first always)."""
    groups: list[list[Evidence]] = []
    for e in sorted(evidence, key=lambda e: (e.question, -e.score)):
        same = next((g for g in groups if g[0].ref == e.ref and g[0].kind == e.kind == "note"
                     and g[0].question == e.question), None)
        if same:
            same.append(e)
        else:
            groups.append([e])
    owner = "Your" if whom == "you" else f"{whom[0].upper()}{whom[1:]}'s"
    glossed_terms: set[str] = set()
    out, used = [], 0
    for group in groups:
        text = sentence_for(group, owner)
        size = len(text.split())
        if out and used + size > words:
            continue
        if used + size + 6 <= words:
            notes = glosses(" ".join(e.text for e in group), glossed_terms, MOST_GLOSSES - len(glossed_terms))
            notes = [n for n in notes if used + size + len(n.split()) + 1 <= words][:1]
            text += f" ({'; '.join(notes)})" if notes else ""
        used += len(text.split())
        out.append({"text": text, "citations": [e.n for e in group], "kind": "answer"})
    return out


def sentence_for(group: list[Evidence], owner: str) -> str:
    first = group[0]
    if first.kind == "coded":
        return f"{owner} record lists: {first.text}" + (f" ({first.date})" if first.date else "") + "."
    group = sorted(group, key=lambda e: (e.span or [0])[0])
    quoted = " ".join(e.text for e in group)
    date = f" of {first.date}" if first.date else ""
    return f"{owner} note{date} says: “{quoted}”"


def shortened(question: str, most: int = 18) -> str:
    words = question.split()
    return " ".join(words[:most]) + ("…" if len(words) > most else "")


# --- the configured language model ----------------------------------------------------------------

def model_sentences(svc, tenant: str, patient_id: str, found: list[Found], evidence: list[Evidence]):
    """The model's plain-language sentences, each verified against the evidence sentences it cites
    (as answers are: concepts with their negation, numbers and dates must be in them), and those
    removed with the reason; None when the model fails. With none kept the extractive draft stands."""
    ids = Identifiers.from_patient(svc.resource(tenant, patient_id, f"Patient/{patient_id}"))
    question = " ".join(f.question for f in found if f.evidence)
    block = [(e.n, e.label, e.text) for e in evidence]
    try:
        draft = generate(svc.llm, "A patient wrote, and a reply in plain words to them is wanted: " + question,
                         block, ids, WRITE_FOR_PATIENT)
    except LlmError:
        return None
    if draft is None:
        return None
    by_n = {e.n: e for e in evidence}
    terms = patient_terms(svc.backend, tenant, patient_id)
    kept, removed = [], []
    for item in draft.statements:
        cited = [c for c in item["citations"] if c in by_n]
        if not cited or len(cited) != len(item["citations"]):
            removed.append({"statement": item["statement"], "reason": "cites no evidence of this reply"})
            continue
        # Verified against the cited sentences themselves, not their whole notes.
        chunks = [replace(by_n[c].chunk, text=by_n[c].text) for c in cited]
        verdict = verify_statement(item["statement"], chunks, terms)
        if verdict.supported:
            kept.append({"text": item["statement"], "citations": cited, "kind": "answer"})
        else:
            removed.append({"statement": item["statement"], "reason": verdict.reason})
    return kept, removed
