"""Clinical annotation with spaCy: which concepts a text mentions, of which semantic type, negated or not.

One pipeline per process (built once, offline, no model download): scispacy's tokenizer and
abbreviation detector, spaCy's sentencizer, phrase matchers built from the shipped lexicon and
from the codings present in the patient's own record, and negspacy's NegEx with its clinical
termset, so "No Known Allergies." and "denies chest pain" are not evidence of either.

A concept is a dict: key ("lex:<canonical>" or "<system>|<code>"), display, semantic_type, negated.
"""
from __future__ import annotations

import gc
import re
import threading
import warnings
from dataclasses import dataclass
from typing import Iterable

from fhir_ingest.record.contract import Chunk
from fhir_ingest.record.without_torch import torch_hidden

from search.nlp.concepts import coded_concepts
from search.nlp.lexicon import Lexicon, default_lexicon, lexicon_key  # noqa: F401  (lexicon_key: read here by others)

TAG = re.compile(r"\s*\((disorder|finding|situation|procedure|substance|product|qualifier value|observable entity|"
                 r"physical object|morphologic abnormality|regime/therapy|event|person|body structure)\)\s*$", re.I)

GLUE = re.compile(r"[/\[\]=_]")


@dataclass(frozen=True)
class RecordTerm:
    """A phrase from the patient's own codings that names a concept ("aortic valve stenosis")."""
    phrase: str
    key: str
    display: str
    semantic_type: str


def record_terms_from_chunks(chunks: Iterable[Chunk]) -> list[RecordTerm]:
    """Phrases for the record's coded concepts: the display without its tag, and for drugs the
    ingredient before the strength ("Tacrolimus 1 MG Oral Capsule" → "tacrolimus")."""
    terms = {}
    for chunk in chunks:
        for coding in chunk.codes:
            system, code, display = coding["system"], coding["code"], coding["display"]
            if not display or not code:
                continue
            key = f"{system}|{code}"
            clean = TAG.sub("", display).strip().lower()
            phrases = {clean}
            if chunk.semantic_type == "medication":
                head = re.split(r"\s\d", clean, maxsplit=1)[0].strip()
                if len(head) >= 4 and not head.startswith("nda"):
                    phrases.add(head)
            for phrase in phrases - GENERIC_DISPLAYS:
                if 3 <= len(phrase) <= 80:
                    terms[(phrase, key)] = RecordTerm(phrase, key, display, chunk.semantic_type)
    return sorted(terms.values(), key=lambda t: (t.phrase, t.key))


# SNOMED CT's top-level displays ("Substance (substance)") name a hierarchy, not a thing: as a
# record phrase they would match every table header and heading that uses the word.
GENERIC_DISPLAYS = frozenset({"substance", "finding", "disorder", "procedure", "situation", "product", "organism",
                              "observable entity", "event", "physical object", "body structure", "qualifier value",
                              "clinical finding", "medication", "allergy", "observation", "unknown", "other"})

NAMES_KEY = "chartcite.record_names"


def same_span_ids(spans) -> dict[tuple[int, int], list[str]]:
    """(start, end) → every entry naming those words."""
    ids: dict[tuple[int, int], list[str]] = {}
    for span in spans:
        ids.setdefault((span.start, span.end), [])
        if span.kb_id_ not in ids[(span.start, span.end)]:
            ids[(span.start, span.end)].append(span.kb_id_)
    return ids


class Annotator:
    def __init__(self, lexicon: Lexicon | None = None):
        with torch_hidden():
            import spacy
        from negspacy.negation import Negex  # noqa: F401  registers the "negex" factory
        from negspacy.termsets import termset
        from scispacy.abbreviation import AbbreviationDetector  # noqa: F401  registers "abbreviation_detector"
        from scispacy.custom_tokenizer import combined_rule_tokenizer
        from spacy.matcher import Matcher, PhraseMatcher

        self.lexicon = lexicon or default_lexicon()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nlp = spacy.blank("en")
            nlp.tokenizer = combined_rule_tokenizer(nlp)
            nlp.add_pipe("sentencizer")
            nlp.add_pipe("abbreviation_detector")
            self.negex = nlp.add_pipe("negex", config={"neg_termset": termset("en_clinical").get_patterns(),
                                                       "chunk_prefix": ["no"]})
        self.nlp = nlp
        self.negex.process_negations = self._triggers_outside_names(self.negex.process_negations)
        self._term_matchers: dict[tuple, object] = {}
        self.entries = {}
        self.record_matcher = PhraseMatcher(nlp.vocab, attr="LOWER")
        self.question_matcher = PhraseMatcher(nlp.vocab, attr="LOWER")
        self.cased_matcher = Matcher(nlp.vocab)
        # member name → the classes that list it; a class can itself be a member ("insulin" of
        # "diabetes medication"), so class membership is followed upwards.
        self.member_of: dict[str, list] = {}
        for entry in self.lexicon.entries:
            for name in entry.members:
                self.member_of.setdefault(name, []).append(entry)
        for i, entry in enumerate(self.lexicon.entries):
            # label → (entry, member name or ""): a member ("atorvastatin", via "lipitor") is its own
            # concept and also carries its class ("statin").
            groups = [(f"E{i}", "", entry.surfaces)]
            groups += [(f"E{i}M{j}", name, [name, *others]) for j, (name, others) in enumerate(entry.members.items())]
            for label, member, surfaces in groups:
                self.entries[label] = (entry, member)
                if entry.case_sensitive:
                    self.cased_matcher.add(label, [[{"ORTH": s}] for s in surfaces if " " not in s])
                    continue
                patterns = list(nlp.tokenizer.pipe(with_plurals(surfaces)))
                self.question_matcher.add(label, patterns)
                if not entry.question_only:
                    self.record_matcher.add(label, patterns)
        self.words_at_start = len(nlp.vocab)

    def words_learnt(self) -> int:
        """Words (lexemes) spaCy's vocabulary has added since the annotator was built."""
        return len(self.nlp.vocab) - self.words_at_start

    @staticmethod
    def _triggers_outside_names(find_triggers):
        """NegEx's trigger finder, minus triggers inside one of the record's own coded names: the
        "free" of "Influenza, seasonal, injectable, preservative free" is part of a vaccine's name,
        not a denial of everything else in the sentence."""
        def find(doc):
            names = doc.user_data.get(NAMES_KEY, ())
            return tuple([m for m in found if not any(start <= m[1] and m[2] <= end for start, end in names)]
                         for found in find_triggers(doc))
        return find

    # --- matching --------------------------------------------------------------------------
    def _lexicon_spans(self, doc, in_question: bool):
        from spacy.tokens import Span

        spans = []
        matcher = self.question_matcher if in_question else self.record_matcher
        matches = list(matcher(doc)) + (list(self.cased_matcher(doc)) if in_question else [])
        for match_id, start, end in matches:
            label = self.nlp.vocab.strings[match_id]
            entry, _ = self.entries[label]
            spans.append(Span(doc, start, end, label=entry.semantic_type, kb_id=label))
        return spans

    def _record_spans(self, doc, terms: list[RecordTerm], matcher):
        from spacy.tokens import Span

        spans = []
        if matcher is None:
            return spans
        for match_id, start, end in matcher(doc):
            term = terms[int(self.nlp.vocab.strings[match_id][1:])]
            spans.append(Span(doc, start, end, label=term.semantic_type, kb_id=f"R{self.nlp.vocab.strings[match_id][1:]}"))
        return spans

    def _term_matcher(self, terms: list[RecordTerm]):
        """A phrase matcher for one patient's record terms, kept for the patient's next question."""
        from spacy.matcher import PhraseMatcher

        if not terms:
            return None
        key = tuple(terms)
        if key not in self._term_matchers:
            matcher = PhraseMatcher(self.nlp.vocab, attr="LOWER")
            for i, term in enumerate(terms):
                matcher.add(f"T{i}", [self.nlp.make_doc(term.phrase)])
            if len(self._term_matchers) >= 64:
                self._term_matchers.pop(next(iter(self._term_matchers)))
            self._term_matchers[key] = matcher
        return self._term_matchers[key]

    def annotate(self, texts: list[str], terms: list[RecordTerm] | None = None,
                 in_question: bool = False, negate: list[bool] | None = None) -> list[list[dict]]:
        """Concepts of each text. `terms` are the patient's record phrases; questions also match
        question-only abbreviations ("K", "ER", "PT"). `negate[i]` False: the caller asserts text
        i's concepts whatever its words say, so NegEx is not run on it."""
        from spacy.util import filter_spans

        terms = terms or []
        matcher = self._term_matcher(terms)
        out = []
        # "A1c/Hemoglobin.total", "mm[Hg]", "K+=3.4": split glued punctuation so phrases match.
        texts = [GLUE.sub(" ", t) for t in texts]
        for i, doc in enumerate(self._docs(texts, negate)):
            lexical = self._lexicon_spans(doc, in_question) + self._defined_abbreviations(doc, in_question)
            concepts: dict[str, dict] = {}
            # Lexicon and record phrases overlap ("blood pressure" inside "blood pressure panel ..."),
            # and entities may not, so each set is resolved and negated on its own and then merged.
            record = filter_spans(self._record_spans(doc, terms, matcher))
            reads_negation = negate is None or negate[i]
            if reads_negation:
                doc.user_data[NAMES_KEY] = [(span.start, span.end) for span in record]
                scopes = self._negation_scopes(doc)
            for spans in (lexical, record):
                # One phrase may name several entries ("Nexplanon": a contraceptive and an implant):
                # a span is kept once for negation, and every entry it names is collected.
                kept = filter_spans(spans)
                if reads_negation:
                    doc.ents = kept
                    kept = self._negated(doc, scopes)
                else:
                    # Without NegEx the spans need not become entities (rebuilt from every token
                    # at each reading: a fifth of annotation).
                    kept = sorted(kept, key=lambda span: span.start)
                self._collect(kept, same_span_ids(spans), terms, concepts, reads_negation)
            out.append(list(concepts.values()))
        return out

    def _defined_abbreviations(self, doc, in_question: bool) -> list:
        """"chronic kidney disease (CKD)": each place the text uses an abbreviation it defines,
        as the concepts of its long form (read once per long form, however often it is used)."""
        found, named = [], {}
        for abbreviation in doc._.abbreviations:
            long_form = abbreviation._.long_form
            where = (long_form.start, long_form.end)
            if where not in named:
                spans = self._lexicon_spans(long_form.as_doc(), in_question)
                named[where] = [(span.label_, span.kb_id_) for span in spans]
            for label, kb_id in named[where]:
                span = doc.char_span(abbreviation.start_char, abbreviation.end_char, label=label, kb_id=kb_id)
                if span is not None:
                    found.append(span)
        return found

    def _negation_scopes(self, doc) -> tuple[list, list, list]:
        """NegEx's triggers and the stretches of text each may reach (sentences, cut at terminating
        phrases: "but"), found once per text for both of its sets of entities."""
        preceding, following, terminating = self.negex.process_negations(doc)
        return preceding, following, self.negex.termination_boundaries(doc, terminating)

    def _negated(self, doc, scopes: tuple[list, list, list]) -> list:
        """doc.ents, each marked negated (`._.negex`) as negspacy's NegEx marks them, but reading
        the entities once: spaCy rebuilds doc.ents from every token at each reading, and NegEx
        read them once per sentence (most of its time on a long note)."""
        negex = self.negex
        preceding, following, boundaries = scopes
        ents = doc.ents
        for start, end in boundaries:
            before = [m[1] for m in preceding if start <= m[1] < end]
            after = [m[2] for m in following if start <= m[1] < end]
            for e in (e for e in ents if e.start >= start and e.end <= end):
                if negex.ent_types and e.label_ not in negex.ent_types:
                    continue
                if any(trigger < e.start for trigger in before) or any(trigger > e.end for trigger in after) \
                        or any(e.text.lower().startswith(c.text.lower()) for c in negex.chunk_prefix):
                    e._.set(negex.extension_name, True)
        return list(ents)

    def _docs(self, texts: list[str], negate: list[bool] | None = None) -> list:
        """The texts through the pipeline, in order, each through the parts it needs. The
        abbreviation detector looks for a short form in parentheses, so a text without "(" skips
        it (it was a third of annotation). A structured text (not negated) skips it too, as its
        parentheses are SNOMED tags the detector misread as definitions ("Depression screening
        (procedure)" gave every screening the concept depression), and skips sentence splitting,
        which only NegEx needs."""
        docs: list = [None] * len(texts)
        skips: dict[tuple, list[int]] = {}
        for i, text in enumerate(texts):
            if negate is not None and not negate[i]:
                skip = ("negex", "abbreviation_detector", "sentencizer")
            else:
                skip = ("negex",) if "(" in text else ("negex", "abbreviation_detector")
            skips.setdefault(skip, []).append(i)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # scispacy warns on every doc that its global matcher is empty
            for skip, which in skips.items():
                for i, doc in zip(which, self.nlp.pipe([texts[i] for i in which], disable=list(skip))):
                    docs[i] = doc
        return docs

    def _collect(self, ents, same_span: dict, terms: list[RecordTerm], concepts: dict[str, dict],
                 negated_by_negex: bool = True) -> None:
        def add(key, display, semantic_type, negated, surface, role="", start=0):
            current = concepts.get(key)
            if current is None:
                concepts[key] = {"key": key, "display": display, "semantic_type": semantic_type, "negated": negated,
                                 "text": surface, "role": role, "start": start}
            elif not negated:
                current["negated"] = False   # asserted once anywhere in the text: asserted

        for ent, kb_id in ((e, k) for e in ents for k in same_span.get((e.start, e.end), [e.kb_id_])):
            negated = negated_by_negex and bool(ent._.negex)
            if kb_id.startswith("E"):
                entry, member = self.entries[kb_id]
                if member:
                    add(lexicon_key(member), member, entry.semantic_type, negated, ent.text, "member", ent.start_char)
                # The class a named member belongs to helps ranking, but never stands in for it:
                # "metformin" is not answered by insulin, though both are diabetes medications.
                add(lexicon_key(entry.canonical), entry.canonical, entry.semantic_type, negated, ent.text,
                    "class" if member else "", ent.start_char)
                for parent in self.classes_of(member or entry.canonical) - {entry.canonical}:
                    add(lexicon_key(parent), parent, entry.semantic_type, negated, ent.text, "class", ent.start_char)
            else:
                term = terms[int(kb_id[1:])]
                add(term.key, term.display, term.semantic_type, negated, ent.text, "", ent.start_char)

    def classes_of(self, name: str, seen: frozenset = frozenset()) -> set[str]:
        out = set()
        for entry in self.member_of.get(name, []):
            if entry.canonical not in seen:
                out.add(entry.canonical)
                out |= self.classes_of(entry.canonical, seen | {name})
        return out

    def annotate_chunks(self, chunks: list[Chunk], terms: list[RecordTerm]) -> list[Chunk]:
        """Concepts from the text (with negation) plus the chunk's own codings (asserted)."""
        # A structured resource is itself the assertion (below): only notes need NegEx.
        negate = [c.semantic_type == "note" for c in chunks]
        for chunk, concepts in zip(chunks, self.annotate([without_headings(c) for c in chunks], terms, negate=negate)):
            if chunk.semantic_type != "note":
                # A structured resource is itself the assertion: NegEx would misread coded names
                # such as "Influenza, seasonal, injectable, preservative free" as denials.
                for c in concepts:
                    c["negated"] = False
            by_key = {c["key"]: c for c in concepts}
            for coding in chunk.codes:
                system, code, display = coding["system"], coding["code"], coding["display"]
                if code:
                    by_key[f"{system}|{code}"] = {"key": f"{system}|{code}", "display": display,
                                                  "semantic_type": chunk.semantic_type, "negated": False}
                # What the coding means in the terminologies (its analyte, vaccine group, ingredients
                # and their classes), asserted like the coding itself.
                for found in coded_concepts(coding, chunk.semantic_type):
                    by_key.setdefault(found["key"], found)["negated"] = False
            chunk.concepts = list(by_key.values())
        return chunks


def without_headings(chunk: Chunk) -> str:
    """A note's section headings ("Allergies:", "Medications:") name a topic, they assert nothing:
    "Allergies: No Known Allergies." must read as a denial, not as an allergy."""
    text = chunk.text
    for heading in chunk.sections:
        text = re.sub(rf"\b{re.escape(heading)}(?: \(continued\))?:", " ", text)
    return text


def with_plurals(surfaces: list[str]) -> list[str]:
    """Each surface and its plural ("ear infection" → "ear infections", "allergy" → "allergies"):
    clinicians ask in both numbers and the matcher compares words exactly."""
    out = list(surfaces)
    for surface in surfaces:
        if len(surface) < 4 or surface[-1] in "s0123456789+" or not surface[-1].isalpha():
            continue
        out.append(surface[:-1] + "ies" if surface.endswith("y") and surface[-2] not in "aeiou" else surface + "s")
    return list(dict.fromkeys(out))


# spaCy's vocabulary keeps every word it has seen (a result's value, an id, a date), about 750
# bytes each, and never forgets one: indexing a 630 MB population grew a process by 100 MB, one
# patient after another. Past this many words learnt, the next caller gets a new annotator (a few
# seconds to build); its annotations are the same, since a word's attributes do not depend on
# what was seen before it.
WORDS_LEARNT_AT_MOST = 100_000

_annotator: Annotator | None = None
_annotator_lock = threading.Lock()


def default_annotator() -> Annotator:
    """The process's annotator (the pipeline and the lexicon matchers: a few seconds to build),
    built again once its vocabulary has learnt WORDS_LEARNT_AT_MOST words."""
    global _annotator
    with _annotator_lock:
        if _annotator is not None and _annotator.words_learnt() > WORDS_LEARNT_AT_MOST:
            # Let go of the old one before the new one is built, so the two are not held at once.
            _annotator = None
            gc.collect()
        if _annotator is None:
            _annotator = Annotator()
        return _annotator


def asserted_keys(concepts: list[dict]) -> set[str]:
    return {c["key"] for c in concepts if not c.get("negated")}


def canonical_names(concepts: list[dict]) -> list[str]:
    """Canonical names to add to a chunk's BM25 text (asserted lexicon concepts only)."""
    return sorted({c["display"] for c in concepts if c["key"].startswith("lex:") and not c.get("negated")})
