"""Question analysis: what a question asks (concepts, kinds of record, intents, time window,
abbreviations and misspellings), read first on its own words and then with the patient's record."""
from __future__ import annotations

import calendar
import re
from datetime import date

from search.nlp.abbreviations import expansions
from search.nlp.annotate import RecordTerm, default_annotator
from search.backends.base import Backend
from search.nlp.lexicon import STOP_WORDS, content_tokens, tokens
from search.nlp.spelling import spelled
from search.nlp.terminology import is_common_word
from search.nlp.vocabulary import (clinical_not_lay, is_clinical_word, is_phrasing, names_a_clinical_thing,
                                   presence_prefix)
from search.retrieval.dates import MONTH_RE as _MONTH_RE, MONTHS, impossible_dates, valid_date
from search.retrieval.timeline import ANCHOR, last_n
from search.retrieval.types import QUESTION_WORDS, Analysis


LATEST = re.compile(r"\b(latest|last|most recent|recent|recently|current|currently|now|today|newest|right now)\b", re.I)
TREND = re.compile(r"\b(trend|trends|trended|trending|over time|changed|change|going up|going down|over the (?:last|past)|"
                   r"gain|gained|loss|lost|vs|versus|compared)\b", re.I)
FIRST = re.compile(r"\b(first|earliest|initial|oldest|original)\b", re.I)
EVER = re.compile(r"\b(ever|history|hx|any|previous|prior|past)\b", re.I)
LIST = re.compile(r"\b(what|which|list|all|any)\b.*\b(meds|medications|drugs|problems|diagnoses|allergies|procedures|"
                  r"vaccines|immunizations|visits|conditions|dx|blood thinners|antiplatelets|statins|pills)\b", re.I)
WHY = re.compile(r"\b(why|reason|what for|for what|indication)\b", re.I)
NOTE_TYPES = ("note",)


# --- stage 2: analyse ---------------------------------------------------------------------------

# Words that name a kind of record rather than a concept: "What procedures were done at the
# stroke visit?" asks for procedures, not for the visit's medications.
RECORD_KIND_WORDS = {
    "procedure": re.compile(r"\b(procedures?|surger(?:y|ies)|operations?|transplant(?:s|ed)?)\b", re.I),
    "medication": re.compile(r"\b(meds|medications?|drugs|prescriptions?|prescribed|taking|takes|pills|tablets|"
                             r"supplements?)\b|\b(?:what|which \w+) (?:was|were|is) (?:she|he|they|the patient|pt) given\b|"
                             r"\b(?:is|was|are|were) (?:she|he|they|the patient|pt) (?:still |currently |now |ever )?on\b", re.I),
    "lab": re.compile(r"\b(labs|lab results|bloodwork|blood work)\b", re.I),
    "vital": re.compile(r"\b(vitals|vital signs)\b", re.I),
    "coverage": re.compile(r"\b(insurance|insurer|insured|payer|payor|health plan|coverage)\b", re.I),
    "goal": re.compile(r"\b(goals?|targets?)\b", re.I),
    "order": re.compile(r"\b(orders?|ordered|referrals?|referred|pending)\b", re.I),
    "family-history": re.compile(r"\b(family (?:history|hx)|fhx|runs in the family)\b", re.I),
    "careplan": re.compile(r"\b(care ?plans?|plans? of care|tx plans?|treatment plans?|plan for (?:his|her|their|the))\b",
                           re.I),
}


# Where a clause ends and the next begins: a dash, a semicolon or colon, a full stop, or a comma
# before a question word ("K+ was 3.1, is she on a diuretic?").
_CLAUSE_BREAK = re.compile(r"\s[—–-]+\s|[;:.!]\s+|,\s+(?=(?:is|was|are|were|does|did|do|has|have|any|what|which|"
                           r"when|why|how|should|could|can)\b)", re.I)
_ASKING = re.compile(r"^\s*(?:is|was|are|were|does|did|do|has|have|had|any|what|which|when|why|how|should|could|can|"
                     r"who|where|list|show|tell)\b|\?\s*$", re.I)


_PURPOSE = re.compile(r"\bfor (?:the |her |his |their |a |an |my )?", re.I)


def purpose_as_context(question: str, target: int, concepts: list[dict]) -> None:
    """"Is he on a triptan for the migraines?" asks about a triptan; the migraines are why. What
    follows "for" is context when the asked clause names something else before it ("What is she
    taking for her BP?" names nothing else: there the BP is what is asked about)."""
    m = _PURPOSE.search(question, target)
    if not m:
        return
    named = {c["key"] for c in concepts if target <= c.get("start", 0) < m.start()
             and c.get("role") not in ("class", "context") and c["semantic_type"] != "note"}
    if not named:
        return
    for concept in concepts:
        if concept.get("start", 0) >= m.end() and concept["key"] not in named and concept["semantic_type"] != "note":
            concept["role"] = "context"


def event_as_context(question: str, concepts: list[dict], kinds: set[str]) -> None:
    """"How long was she in the SNF after the wrist fx?" asks about the SNF stay; the fracture
    only says when. Concepts inside the event a question anchors its time to are context, when
    the question asks about something else (another concept, or a kind of record it names)."""
    m = ANCHOR.search(question)
    if not m:
        return
    start, end = m.span(3)
    inside = [c for c in concepts if start <= c.get("start", -1) < end]
    asked = [c for c in concepts if c not in inside and c.get("role") not in ("class", "context")
             and c["semantic_type"] != "note"]
    if inside and (asked or kinds or asks_words_outside(question, m.span(0))):
        for concept in inside:
            concept["role"] = "context"


def asks_words_outside(question: str, span: tuple[int, int]) -> bool:
    """The question names something of its own outside the event it is anchored to ("any IM
    injections after the IUD went in?", "risky behaviors flagged at the well visit"), not only
    how it asks ("what happened at the ER visit?")."""
    rest = question[:span[0]] + " " + question[span[1]:]
    return any(t not in QUESTION_WORDS and t not in MONTHS and not t.isdigit() and not is_phrasing(t) and len(t) > 2
               for t in content_tokens(rest))


def target_offset(question: str) -> int:
    """Where the asked clause begins. "Her potassium was low — is she on a diuretic?" asks about a
    diuretic; the potassium is context. A question of several questions is asked whole."""
    for brk in reversed(list(_CLAUSE_BREAK.finditer(question))):
        head, tail = question[:brk.start()], question[brk.end():]
        if tail.strip() and _ASKING.search(tail) and not head.rstrip().endswith("?") and not _ASKING.match(head):
            return brk.end()
    return 0


def asks_for_the_first(question: str) -> bool:
    """"First rx on file?", "earliest A1c": the oldest is asked for. "At her first prenatal
    visit" only names an event the question is anchored to."""
    anchored = [m.span(2) for m in ANCHOR.finditer(question) if m.group(2)]
    return any(not any(a <= m.start() < b for a, b in anchored) for m in FIRST.finditer(question))


def analyse(question: str, terms: list[RecordTerm] | None = None) -> Analysis:
    typed = question
    question, corrections = spelled(question)
    concepts = default_annotator().annotate([question], terms or [], in_question=True)[0]
    concepts, abbreviations = with_abbreviations(question, concepts, terms or [])
    concepts += record_words(question, concepts, terms or [])
    target = target_offset(question)
    purpose_as_context(question, target, concepts)
    if target:
        asked = {c["key"] for c in default_annotator().annotate([question[target:]], terms or [], in_question=True)[0]}
        for concept in concepts:
            # Named before the asked clause and not again in it: context ("K+ was low — on a diuretic?").
            if concept.get("start", 0) < target and concept["key"] not in asked and concept["semantic_type"] != "note":
                concept["role"] = "context"
    date_from, date_to = time_window(question)
    kinds = {kind for kind, words in RECORD_KIND_WORDS.items() if words.search(question)}
    event_as_context(question, concepts, kinds)
    # Named only through the record's own words, the thing asked is what the answer must rest on.
    if not any(c.get("role") == "" and c["semantic_type"] != "note" for c in concepts):
        for concept in concepts:
            if concept.get("role") == "record":
                concept["role"] = ""
    return Analysis(
        question, concepts, content_tokens(question), sorted({c["semantic_type"] for c in concepts} | kinds),
        date_from, date_to, wants_latest=bool(LATEST.search(question)), wants_first=asks_for_the_first(question),
        wants_trend=bool(TREND.search(question)),
        wants_ever=bool(EVER.search(question)), wants_list=bool(LIST.search(question)),
        wants_why=bool(WHY.search(question)), kinds=tuple(sorted(kinds)),
        expansions=search_forms(concepts, abbreviations), target=target, abbreviations=abbreviations,
        last_n=last_n(question), impossible_dates=impossible_dates(typed),
        corrections=[f"{wrong} → {right}" for wrong, right in corrections])


# Words of the record's coded names that name no particular thing ("Retinopathy due to type 2
# diabetes mellitus (disorder)": "due", "type" and "disorder" say nothing a question could mean).
GENERIC_RECORD_WORDS = frozenset("""
disorder finding situation procedure substance product history record artifact regime therapy patient
education unspecified type due care plan service services encounter screening assessment test tests
level levels count finding body structure clinical general status total serum plasma blood urine mass
volume moles presence person family social management activity activities normal abnormal with without
""".split())
MOST_RECORD_TERMS = 12     # a word in more of the patient's coded names than this names no one thing


def record_words(question: str, concepts: list[dict], terms: list[RecordTerm]) -> list[dict]:
    """A word of the question that no concept covers but that the patient's own coded names use
    ("retinopathy" of "Moderate non-proliferative diabetic retinopathy", "milk" of "Allergy to
    cow's milk") names those records: the record's codings and displays are a vocabulary too."""
    covered = [(c.get("start", 0), c.get("start", 0) + len(c.get("text", ""))) for c in concepts]
    by_word: dict[str, list[RecordTerm]] = {}
    for term in terms:
        for word in set(tokens(term.phrase)):
            by_word.setdefault(word, []).append(term)
    found, seen = [], {c["key"] for c in concepts}
    for m in re.finditer(r"[a-z][a-z'-]+", question.lower()):
        word = m.group(0)
        if any(s <= m.start() < e for s, e in covered) or len(word) < 3 or word in STOP_WORDS \
                or word in QUESTION_WORDS or word in GENERIC_RECORD_WORDS or is_common_word(word) or names_a_kind(word):
            continue
        named = by_word.get(word) or by_word.get(word.rstrip("s")) or spelled_out(word, terms) \
            or by_word.get(same_word(word, by_word) or "")
        if not named or len(named) > MOST_RECORD_TERMS:
            continue
        for term in named:
            if term.key not in seen:
                seen.add(term.key)
                # Found through the record's own names, they steer recall and ranking; what the
                # answer must rest on stays what the question named (role "record" is not required).
                found.append({"key": term.key, "display": term.display, "semantic_type": term.semantic_type,
                              "negated": False, "text": m.group(0), "role": "record", "start": m.start()})
    return found


def same_word(word: str, vocabulary) -> str | None:
    """The record's word that is the question's with another ending ("risky" → risk,
    "transport" → transportation, "assess" → assessment): the shorter, of five letters or more,
    begins the longer, which has at most five more; or an adjective's "-y" on the record's noun."""
    for candidate in vocabulary:
        if word.endswith("y") and word[:-1] == candidate and len(candidate) >= 4:
            return candidate
        short, long = sorted((word, candidate), key=len)
        if len(short) >= 5 and long.startswith(short) and len(long) - len(short) <= 5:
            return candidate
    return None


SHORTEST_ACRONYM = 4     # three letters fall by chance among the initials of a long coded name


def spelled_out(word: str, terms: list[RecordTerm]) -> list[RecordTerm]:
    """The record's coded names whose words' initials spell an acronym of the question that no
    abbreviation list has ("CRAFFT": "Car, Relax, Alone, Forget, Friends, Trouble Screening Test")."""
    if len(word) < SHORTEST_ACRONYM or not word.isalpha() or is_common_word(word):
        return []
    return [term for term in terms if word in "".join(t[0] for t in tokens(term.phrase))]


def with_abbreviations(question: str, concepts: list[dict], terms: list[RecordTerm]) -> tuple[list[dict], dict[str, list[str]]]:
    """The question's concepts plus those its abbreviations' long forms name ("DOAC" → direct
    oral anticoagulant), each placed where the abbreviation stands; and each abbreviation's long
    forms, by the abbreviation."""
    covered = [(c.get("start", 0), c.get("start", 0) + len(c.get("text", ""))) for c in concepts]
    found = expansions(question, covered)
    if not found:
        return concepts, {}
    keys = {c["key"] for c in concepts}
    forms = [form for _, _, long_forms in found for form in long_forms]
    annotated = default_annotator().annotate(forms, terms, in_question=True)
    per_form = iter(annotated)
    for start, token, long_forms in found:
        for form in long_forms:
            from_record = named_in_record(form, terms) if not names_a_kind(form) else []
            for concept in next(per_form) or from_record:
                # "vaccine" of "inactivated poliovirus vaccine" says only what kind of record it is
                generic = concept["display"] == concept["semantic_type"] or names_a_kind(concept["display"])
                if concept["key"] not in keys and not generic:
                    keys.add(concept["key"])
                    concepts.append(concept | {"start": start, "text": token, "via": form})
    return concepts, {token.lower(): long_forms for _, token, long_forms in found}


def search_forms(analysis_concepts: list[dict], abbreviations: dict[str, list[str]]) -> list[str]:
    """Long forms worth adding to the search text: those of abbreviations no other vocabulary
    matched ("ED" of "ED visit" is already the emergency visit; adding "erectile dysfunction"
    would only blur the search)."""
    matched = {c.get("text", "").lower() for c in analysis_concepts if not c.get("via")}
    return [form for token, forms in abbreviations.items() if token not in matched for form in forms]


def named_in_record(form: str, terms: list[RecordTerm]) -> list[dict]:
    """The patient's coded names that say a long form no vocabulary knows in other words ("IPV":
    intimate partner violence, recorded as "Victim of intimate partner abuse"): at least two of
    its words (its one word, for a one-word form), as written or with another ending."""
    words = [w for w in content_tokens(form) if w not in GENERIC_RECORD_WORDS and len(w) > 2]
    if not words:
        return []
    found = []
    for term in terms:
        have = set(tokens(term.phrase))
        shared = [w for w in words if w in have or same_word(w, have)]
        if len(shared) >= min(2, len(words)):
            found.append({"key": term.key, "display": term.display, "semantic_type": term.semantic_type,
                          "negated": False, "role": "record"})
    return found if len(found) <= MOST_RECORD_TERMS else []


def time_window(question: str) -> tuple[str, str]:
    """Explicit dates in the question → an inclusive ISO window ('May 30, 2025', 'Oct 2022', 'since 2023').

    Questions are text: an impossible date ("2023-02-30", "since 0000-01-01") is a date the
    question does not have, never an error."""
    q = question.lower()
    m = re.search(r"\b(\d{4})-(\d{2})-(\d{2})\b", q)
    if m:
        d = valid_date(int(m.group(1)), int(m.group(2)), int(m.group(3)))
        return (d, d) if d else ("", "")
    m = re.search(r"\b(\d{1,2})/(\d{1,2})/(\d{4}|\d{2})\b", q)
    if m:      # month/day/year, as US charts write it ("the 2/1/25 ED visit")
        year = int(m.group(3)) if len(m.group(3)) == 4 else 2000 + int(m.group(3))
        d = valid_date(year if year <= date.today().year else year - 100, int(m.group(1)), int(m.group(2)))
        return (d, d) if d else ("", "")
    m = re.search(rf"\b({_MONTH_RE})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", q)
    if m:
        d = valid_date(int(m.group(3)), MONTHS[m.group(1)], int(m.group(2)))
        if d:
            return d, d
    m = re.search(rf"\b({_MONTH_RE})\.?\s+(\d{{4}})\b", q)
    if m and valid_date(int(m.group(2)), MONTHS[m.group(1)], 1):
        year, month = int(m.group(2)), MONTHS[m.group(1)]
        last = calendar.monthrange(year, month)[1]
        since = re.search(rf"\b(since|after|from)\s+{re.escape(m.group(0))}", q)
        return f"{year:04d}-{month:02d}-01", ("" if since else f"{year:04d}-{month:02d}-{last:02d}")
    m = re.search(r"\b(since|after)\s+(\d{4})\b", q) or (len(years_named(q)) < 2 and re.search(r"\b(from)\s+(\d{4})\b", q))
    if m and valid_date(int(m.group(2)), 1, 1):
        return f"{m.group(2)}-01-01", ""
    years = years_named(q)
    if len(years) >= 2:          # "wt gain from the 2023 to the 2024 physical": both, and between
        return f"{min(years)}-01-01", f"{max(years)}-12-31"
    m = re.search(r"\b(19[5-9]\d|20[0-4]\d)\b.*\b(?:vs\.?|versus|compared (?:to|with))\s+(?:the\s+)?"
                  r"(?:prior|previous|earlier|past|last)\b", q)
    if m:                        # "wt at the 2025 physical vs the prior years": up to that year
        return "", f"{m.group(1)}-12-31"
    if dated_on_one_side(q):
        return "", ""
    m = re.search(r"\b(?:in|during|of)\s+(\d{4})\b", q) or re.search(r"\b(19[5-9]\d|20[0-4]\d)\b", q)
    if m and valid_date(int(m.group(1)), 1, 1):
        return f"{m.group(1)}-01-01", f"{m.group(1)}-12-31"
    return "", ""


# Two things compared: "bp meds when she left after the pacemaker vs what she was taking in 2009".
COMPARED = re.compile(r"\b(?:vs\.?|versus|compared (?:to|with)|and then|then and now)\b")


def dated_on_one_side(q: str) -> bool:
    """A comparison whose year is on one side only: the other side is another time (the
    discharge of 2007), so the year does not window the whole question."""
    parts = COMPARED.split(q, maxsplit=1)
    return len(parts) == 2 and sum(bool(years_named(part)) for part in parts) == 1


def anchored_on_one_side(q: str) -> bool:
    """A comparison whose event ("at cath", "after the pacemaker") is on one side only: the
    other side ("the EF on the echo") is another time, so the event does not window the whole
    question (the echo's note, of another day, was out of scope and one note filled the evidence)."""
    parts = COMPARED.split(q.lower(), maxsplit=1)
    return len(parts) == 2 and sum(bool(ANCHOR.search(part)) for part in parts) == 1


def years_named(q: str) -> list[int]:
    return sorted({int(y) for y in re.findall(r"\b(19[5-9]\d|20[0-4]\d)\b", q) if valid_date(int(y), 1, 1)})


def expanded_query(analysis: Analysis) -> str:
    """The question's content words plus canonical names of its concepts (an LLM-free expansion)."""
    return " ".join(analysis.terms + analysis.names + analysis.expansions)


def patient_terms(backend: Backend, tenant: str, patient_id: str) -> list[RecordTerm]:
    return terms_of(backend.get_patient(tenant, patient_id) or {})


def terms_of(summary: dict) -> list[RecordTerm]:
    return [RecordTerm(*t) for t in summary.get("terms", [])]


def read_abbreviations_by_the_record(analysis: Analysis, backend: Backend, tenant: str, patient_id: str) -> None:
    """An abbreviation with several long forms means the ones this patient's record spells out
    ("CEA" is a carotid endarterectomy in a vascular patient's notes, carcinoembryonic antigen in
    an oncology workup): forms whose every word the record has are kept, the others dropped from
    the words searched; when the record spells out none, or all, all stay."""
    ambiguous = {token: forms for token, forms in analysis.abbreviations.items() if len(forms) > 1}
    if not ambiguous:
        return
    probes = {form: [presence_prefix(t) for t in re.findall(r"[a-z0-9]{2,}", form.lower()) if t not in STOP_WORDS]
              for forms in ambiguous.values() for form in forms}
    present = backend.has_terms(tenant, patient_id, sorted({t for ts in probes.values() for t in ts if t}), prefix=True)
    dropped, narrowed = set(), set()
    for token, forms in ambiguous.items():
        spelt = [form for form in forms if probes[form] and all(t in present for t in probes[form])]
        if spelt and len(spelt) < len(forms):
            analysis.abbreviations[token] = spelt
            dropped |= set(forms) - set(spelt)
            narrowed.add(token)
    if dropped:
        # The words searched and the sentences read are the record's own reading.
        analysis.expansions = [e for e in analysis.expansions if e not in dropped]
        drop_concepts_of_unspelt_forms(analysis, dropped, narrowed, backend, tenant, patient_id)


def drop_concepts_of_unspelt_forms(analysis: Analysis, dropped: set[str], narrowed: set[str], backend: Backend,
                                   tenant: str, patient_id: str) -> None:
    """A concept read from an abbreviation through a long form the record never spells ("CEA" as
    carcinoembryonic antigen in a vascular patient's record) is not what the question asks: kept,
    it is required of the record and the question is declared unanswered although the record's
    own reading (the carotid endarterectomy) answers it. It stays when the record holds it coded
    (a coded name may word it otherwise)."""
    unspelt = {" ".join(content_tokens(form)) for form in dropped}
    candidates = [c for c in analysis.concepts if (c.get("text") or "").lower() in narrowed
                  and (" ".join(content_tokens(c.get("via") or c["display"])) in unspelt)]
    if not candidates:
        return
    present = backend.concepts_present(tenant, patient_id, sorted({c["key"] for c in candidates}))
    gone = {id(c) for c in candidates if c["key"] not in present}
    if not gone:
        return
    analysis.concepts = [c for c in analysis.concepts if id(c) not in gone]
    # The word was read as that concept, so its long forms were never searched: the record's are now.
    kept = [form for token in narrowed for form in analysis.abbreviations.get(token, [])]
    analysis.expansions = list(dict.fromkeys([*analysis.expansions, *kept]))


def read_ambiguous_words_by_the_record(analysis: Analysis, backend: Backend, tenant: str, patient_id: str) -> None:
    """One word with several clinical readings ("PT": physical therapy or prothrombin time; "OD":
    overdose or right eye) means what this patient's record holds: readings the record asserts
    are kept and the others dropped; when the record holds none of them, all stay."""
    # One word read several ways: concepts whose spans overlap ("ED" of "ED visit").
    spans: list[tuple[int, int, list[dict]]] = []
    for concept in sorted(analysis.concepts, key=lambda c: c.get("start", 0)):
        start = concept.get("start", 0)
        end = start + max(len(concept.get("text", "")), 1)
        if spans and start < spans[-1][1]:
            spans[-1] = (spans[-1][0], max(end, spans[-1][1]), spans[-1][2] + [concept])
        else:
            spans.append((start, end, [concept]))
    ambiguous = [group for _, _, group in spans
                 if len({c["semantic_type"] for c in group if c.get("role") not in ("class", "context")}) > 1]
    if not ambiguous:
        return
    present = backend.concepts_present(tenant, patient_id, sorted({c["key"] for g in ambiguous for c in g}))
    dropped = set()
    for group in ambiguous:
        if any(c["key"] in present for c in group):
            dropped |= {id(c) for c in group if c["key"] not in present}
    analysis.concepts = [c for c in analysis.concepts if id(c) not in dropped]


def clinical_residual(analysis: Analysis) -> set[str]:
    """The question's clinical words no concept covers. With a concept asked about, only its
    qualifiers count ("breast" of breast cancer), by the wider vocabulary qualifiers have."""
    if analysis.required_keys:
        found = {t for t in analysis.modifiers(set(analysis.residual)) if is_clinical_word(t, qualifier=True)}
    else:
        found = {t for t in analysis.residual if is_clinical_word(t)}
    return {t for t in found if not is_phrasing(t)}


def names_a_kind(word: str) -> bool:
    """"Surgery", "meds", "labs": a kind of record the question asks within, not a thing to find."""
    return any(words.fullmatch(word) for words in RECORD_KIND_WORDS.values())


def asked_span(analysis: Analysis) -> tuple[int, int, list[tuple[int, int]]]:
    """Where the asked clause is, less what only places it in time ("after the wrist fx") or says
    what it is for ("... for the colon ca", when the clause names something before "for")."""
    q = analysis.question
    start, end, skip = analysis.target, len(q), []
    anchored = ANCHOR.search(q, start)
    if anchored:
        skip.append(anchored.span(3))
    purpose = _PURPOSE.search(q, start)
    if purpose and any(t not in QUESTION_WORDS for t in content_tokens(q[start:purpose.start()])):
        end = purpose.start()
    return start, end, skip


def asked_words(analysis: Analysis) -> dict[str, list[str]]:
    """The words of the asked clause no concept covers that can only name a clinical thing, each
    with what would show it in the record: the word, and an abbreviation's long forms."""
    start, end, skip = asked_span(analysis)
    skip += [(c.get("start", 0), c.get("start", 0) + len(c.get("text", ""))) for c in analysis.concepts]
    residual = set(analysis.residual)
    found: dict[str, list[str]] = {}
    previous = ""
    for m in re.finditer(r"[a-z][a-z0-9'/-]*", analysis.question.lower()):
        word, before = m.group(0).strip("'-/"), previous
        previous = m.group(0)
        if not (start <= m.start() < end) or any(a <= m.start() < b for a, b in skip) \
                or not (word in residual or word in analysis.abbreviations) or set(word.split("-")) <= set(MONTHS):
            continue
        long_forms = analysis.abbreviations.get(word, [])
        if names_a_clinical_thing(word, abbreviation=bool(long_forms)):
            if before in residual and not is_phrasing(before) and is_clinical_word(before, qualifier=True):
                found[before] = [before]       # which one: a *renal* ultrasound
            spaced = re.sub(r"(?<=[a-z])(?=\d)", " ", word)
            written = [word, spaced] if not long_forms or re.fullmatch(r"[a-z0-9]+", word) else []   # "u/s": its long form
            # "right eye (oculus dexter)": the record may say either
            glossed = [part for form in long_forms for part in re.split(r"\s*[()]\s*", form) if part.strip()]
            found[word] = list(dict.fromkeys([*written, *glossed]))
    return found


# What about the thing a question wants ("which *side* was the CEA", "*size* and location of the
# stone"): the thing comes after these words, and a record may never write them.
ASKED_ABOUT = frozenset("side sides laterality location size extent".split())


def asked_head(analysis: Analysis) -> list[str]:
    """The thing asked, when no concept names anything the question asks: the first content word
    of the asked clause ("what did *pathology* say about the appendix", "is an *amputation*
    planned"), when clinical sources write it and it is no lay word (clinical_not_lay). The
    record never using it means the record cannot answer, however close a passage about the
    appendix or the foot comes."""
    if analysis.required_keys:
        return []
    start, end, skip = asked_span(analysis)
    residual = set(analysis.residual)
    for m in re.finditer(r"[a-z][a-z0-9'/-]*", analysis.question.lower()):
        word = m.group(0).strip("'-/")
        if not (start <= m.start() < end) or any(a <= m.start() < b for a, b in skip):
            continue
        if word in STOP_WORDS or word in QUESTION_WORDS or word in ASKED_ABOUT or is_phrasing(word) or len(word) < 4:
            continue
        # The first content word is the head; only one no concept covers can be required.
        return [word] if word in residual and word.isalpha() and clinical_not_lay(word) else []
    return []


# Words that ask for something about a thing ("battery *status*", "*results* of his swallow
# study"): the thing beside them is what the question is about.
ATTRIBUTE_OF = frozenset("result results status level levels value values reading readings finding findings".split())
_LINKS = frozenset("of on".split())       # "results *from* the tonsils" says where from, not what
_DETERMINERS = frozenset("the his her their my a an its".split())
# Words that say what kind of look was taken, not at what: "test results" alone names no thing.
_KIND_OF_LOOK = frozenset("test tests study studies scan scans check checks exam exams work panel lab labs".split())


def asked_things(analysis: Analysis) -> list[str]:
    """The thing whose result, status or level the asked clause wants, when no concept names it:
    the words beside the attribute ("h pylori *result*", "*results of* his swallow study"), as one
    phrase. The record must write that phrase, not only one of its words: a patient with "trouble
    swallowing" has no swallow study, and a pacemaker note that never says "battery" has no
    battery status, however near a passage about the device comes."""
    start, end, skip = asked_span(analysis)
    concepts = [(c.get("start", 0), c.get("start", 0) + len(c.get("text", ""))) for c in analysis.concepts]
    q = analysis.question.lower()
    words = [(m.group(0), m.start(), m.end()) for m in re.finditer(r"[a-z][a-z0-9'-]*", q) if start <= m.start() < end]
    things = []
    for i, (word, _, _) in enumerate(words):
        if word in ATTRIBUTE_OF:
            before = _thing_run(analysis, words, i - 1, -1, skip, concepts)
            after = i + 1
            while after < len(words) and words[after][0] in _LINKS | _DETERMINERS and _joined(q, words, after - 1):
                after += 1
            after_run = _thing_run(analysis, words, after, 1, skip, concepts) if after > i + 1 else []
            things += [thing for thing in (_thing_named(words, run) for run in (before, after_run)) if thing]
    return list(dict.fromkeys(things))


def _thing_named(words: list, run: list[int]) -> str:
    """The run as a phrase, from its first word the lexicon does not know: a lexicon word ("sugar"
    of "sugar readings", "blood work") may be written in the record by its clinical name, which
    its concept finds; a word it does not know ("battery", "swallow") can only be found as
    written. "Test results" alone names no thing."""
    phrase = [words[j][0] for j in sorted(run)]
    while phrase and is_clinical_word(phrase[0], qualifier=True):
        phrase = phrase[1:]
    if not phrase or set(phrase) <= _KIND_OF_LOOK or names_a_kind(" ".join(phrase)):
        return ""
    return " ".join(phrase)


def _joined(q: str, words: list, i: int) -> bool:
    """Word i and the next are one phrase: only spaces between them ("status? DNR" is not)."""
    return i + 1 < len(words) and not q[words[i][2]:words[i + 1][1]].strip()


def _thing_run(analysis: Analysis, words: list, i: int, step: int, skip: list, concepts: list) -> list[int]:
    """Up to three words from word i on (step -1: backwards) that may name a thing no concept
    names. A run that reaches a concept's word is that concept's ("hearing *test*"): the concept
    is judged as such, and a word like "test" alone is never required."""
    residual, run = set(analysis.residual), []
    while 0 <= i < len(words) and len(run) < 3 and (not run or _joined(analysis.question.lower(), words, min(i, i - step))):
        word, at, _ = words[i]
        if any(a <= at < b for a, b in concepts):
            return []
        if not (word in residual and word.isalpha() and not any(a <= at < b for a, b in skip)
                and word not in ATTRIBUTE_OF and word not in ASKED_ABOUT and not is_phrasing(word) and not names_a_kind(word)):
            break
        run.append(i)
        i += step
    return run


def absent_things(backend: Backend, tenant: str, patient_id: str, analysis: Analysis) -> set[str]:
    """The asked things (asked_things) this patient's record never writes as a phrase, in any
    ending of its words (the index holds stems)."""
    things = {thing: " ".join(thing.split()[:-1] + [presence_prefix(thing.split()[-1])]) for thing in asked_things(analysis)}
    if not things:
        return set()
    present = backend.has_terms(tenant, patient_id, sorted(set(things.values())), prefix=True)
    return {thing for thing, probe in things.items() if probe not in present}


def absent_words(backend: Backend, tenant: str, patient_id: str, analysis: Analysis) -> set[str]:
    """The question's clinical words this patient's record never uses, in any of their forms (a
    long form counts when each of its words is in the record), and the asked things it never
    writes."""
    return absent_terms(backend, tenant, patient_id, analysis) | absent_things(backend, tenant, patient_id, analysis)


def absent_terms(backend: Backend, tenant: str, patient_id: str, analysis: Analysis) -> set[str]:
    """The question's clinical words this patient's record never uses, in any of their forms."""
    words = {w: forms for w, forms in ({w: [w] for w in clinical_residual(analysis)} | asked_words(analysis)
                                       | {w: [w] for w in asked_head(analysis)}).items()
             if not names_a_kind(w)}
    if not words:
        return set()
    probes = {w: [probe for probe in ([presence_prefix(t) for t in re.findall(r"[a-z0-9]{2,}", form.lower())
                                       if t not in STOP_WORDS] for form in forms) if probe]
              for w, forms in words.items()}
    wanted = sorted({t for forms in probes.values() for form in forms for t in form})
    present = backend.has_terms(tenant, patient_id, wanted, prefix=True)
    return {w for w, forms in probes.items() if not any(all(t in present for t in form) for form in forms)}
ACROSS = re.compile(r"\b(and then|then and now|at follow-?up|second|both|each time|,? and (?:what|which|how|when|where|why))\b",
                    re.I)


def spans_notes(analysis: Analysis) -> bool:
    """The question asks across several notes: it compares (two years, "vs", "then and now",
    "first ... second") or asks two things at once. A list ("what meds did she go home on") is
    often one note's section, and cutting that note cut the list."""
    q = analysis.question
    return analysis.wants_trend or len(years_named(q)) > 1 or bool(ACROSS.search(q))
