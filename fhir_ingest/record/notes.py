"""Clinical note text: decode attachments and split them into sections.

Attachments come as base64 `data` (or, from a live EHR, as a `Binary` URL fetched by the client)
in text/plain, text/html, text/rtf or application/pdf.
"""
from __future__ import annotations

import base64
import binascii
import html
import io
import json
import logging
import re
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from html.parser import HTMLParser
from pathlib import Path

from fhir_ingest.record.without_torch import torch_hidden


class NoteDecodeError(ValueError):
    pass


HTML_TYPES = ("text/html", "application/xhtml+xml", "application/xhtml")
# CDA documents (C-CDA discharge summaries, progress notes) arrive under any of these.
XML_TYPES = ("application/xml", "text/xml", "application/hl7-v3+xml", "application/cda+xml", "application/hl7-cda+xml")


def decode_attachment(attachment: dict) -> str:
    """Plain text of an attachment with inline base64 `data`."""
    data = attachment.get("data")
    if not data:
        raise NoteDecodeError("attachment has no inline data")
    try:
        raw = base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError) as exc:
        raise NoteDecodeError(f"attachment data is not base64: {exc}") from exc
    return bytes_to_text(raw, attachment.get("contentType", "text/plain"))


def bytes_to_text(raw: bytes, content_type: str) -> str:
    mime, _, params = (content_type or "text/plain").partition(";")
    mime = mime.strip().lower()
    charset = "utf-8"
    match = re.search(r"charset=([\w-]+)", params)
    if match:
        charset = match.group(1)
    if mime == "application/pdf":
        return pdf_to_text(raw)
    try:
        text = raw.decode(charset, errors="replace")
    except LookupError:
        text = raw.decode("utf-8", errors="replace")
    if mime in HTML_TYPES:
        return html_to_text(text)
    if mime in XML_TYPES:
        return xml_to_text(text)
    if mime in ("text/rtf", "application/rtf"):
        return rtf_to_text(text)
    if mime.startswith("text/"):
        return text
    raise NoteDecodeError(f"unsupported note content type {mime!r}")


class _HTMLText(HTMLParser):
    # HTML's blocks and CDA narrative's (paragraph, list item, table row).
    BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "table", "paragraph",
             "item", "list"}
    HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style"):
            self.skip += 1
        if tag in self.BLOCK:
            self.parts.append("\n")
        if tag in self.HEADINGS:
            self.parts.append("# ")

    def handle_endtag(self, tag):
        if tag in ("script", "style"):
            self.skip = max(0, self.skip - 1)
        if tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def html_to_text(text: str) -> str:
    parser = _HTMLText()
    parser.feed(text)
    parser.close()
    out = html.unescape("".join(parser.parts))
    return re.sub(r"\n{3,}", "\n\n", out)


DOCTYPE = re.compile(r"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)


def xml_to_text(text: str) -> str:
    """A CDA document's readable part: each section's title as a heading and its narrative text.
    Other XML: all of its text.

    A document type declaration is refused outright: a CDA document never needs one, and it is
    where entity expansion (the "billion laughs") and external entities live, whatever a given
    expat release happens to cap."""
    import xml.etree.ElementTree as ET

    if DOCTYPE.search(text):
        raise NoteDecodeError("XML with a document type declaration (<!DOCTYPE or <!ENTITY) is refused; "
                              "CDA documents carry none")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise NoteDecodeError(f"unreadable XML: {exc}") from None
    for element in root.iter():
        if isinstance(element.tag, str):
            element.tag = element.tag.rsplit("}", 1)[-1]
    sections = [element for element in root.iter("section")]
    if not sections:
        return "\n".join(part.strip() for part in root.itertext() if part.strip())
    out = []
    for section in sections:
        title, narrative = section.find("title"), section.find("text")
        if title is not None and "".join(title.itertext()).strip():
            out.append("# " + " ".join("".join(title.itertext()).split()))
        if narrative is not None:
            out.append(html_to_text(ET.tostring(narrative, encoding="unicode")))
    return "\n".join(out)


def rtf_to_text(text: str) -> str:
    from striprtf.striprtf import rtf_to_text as strip

    return strip(text)


def pdf_to_text(raw: bytes) -> str:
    try:
        from pypdf import PdfReader
    except ImportError as exc:  # pragma: no cover - pypdf is a declared dependency
        raise NoteDecodeError("PDF notes need the pypdf package") from exc
    # pypdf logs every quirk of a damaged file at WARNING; the outcome is reported per note instead.
    logging.getLogger("pypdf").setLevel(logging.ERROR)
    try:
        reader = PdfReader(io.BytesIO(raw))
        return "\n".join(page.extract_text() or "" for page in reader.pages)
    except Exception as exc:  # pypdf raises many error types for broken files
        raise NoteDecodeError(f"unreadable PDF: {exc}") from exc


@dataclass
class Section:
    heading: str
    text: str
    kind: str = ""          # what the section is (section_kind): "medication", "allergy", "plan"...


@dataclass(frozen=True)
class Sentence:
    """A sentence of a note and where it is: text[start:end] is the sentence, verbatim."""
    start: int
    end: int
    text: str


_DATA = Path(__file__).with_name("data")


@lru_cache(maxsize=1)
def _rush():
    with torch_hidden():         # PyRuSH imports spaCy, and a record's notes are split before annotation
        from PyRuSH import RuSH

    # A list item or a heading's one word ("NONE.", "Sulfa.") is a sentence too.
    return RuSH(str(_DATA / "rush_rules.tsv"), min_sent_chars=1)


_LIST_NUMBER = re.compile(r"\(?\d{1,2}[.)]")
_LIST_LINE = re.compile(r"\n(?=[ \t]*\(?\d{1,2}[.)]\s)")


def _rush_spans(text: str):
    """PyRuSH's sentence spans, a numbered line always starting a new one (RuSH alone may run a
    list item on into the next line's)."""
    start = 0
    for cut in [m.start() for m in _LIST_LINE.finditer(text)] + [len(text)]:
        # RuSH finds the last boundaries of a text reliably only when a line end follows them.
        for span in _rush().segToSentenceSpans(text[start:cut] + "\n"):
            yield start + span.begin, start + min(span.end, cut - start)
        start = cut + 1


# Answering splits the same evidence texts several times a question (the class in the notes, the
# ranked and the quoted sentences) and again for the next question: PyRuSH was 60% of an answer's
# time. Texts up to a chunk's size are remembered with their spans, at most REMEMBERED_TEXTS of
# them and REMEMBERED_TOTAL characters (about 8 MB); a long note line met while indexing is split
# once and not kept. The index keeps each note chunk's splits too (search/sentence_readings.py), and
# they are handed back here (remember_splits), so another process does not split them again.
REMEMBERED_TEXTS, REMEMBERED_CHARS, REMEMBERED_TOTAL = 8192, 4000, 8_000_000
Spans = tuple[tuple[int, int], ...]


class _RememberedSplits:
    """Text -> its sentence spans, the least recently used forgotten first; safe across the web
    app's answering threads."""

    def __init__(self, size: int, chars: int):
        self.size, self.most_chars, self.chars, self.made = size, chars, 0, 0
        self.spans: OrderedDict[str, Spans] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, text: str) -> Spans | None:
        with self.lock:
            spans = self.spans.get(text)
            if spans is not None:
                self.spans.move_to_end(text)
            return spans

    def put(self, text: str, spans: Spans, split_here: bool = False) -> None:
        with self.lock:
            self.made += split_here
            if text not in self.spans:
                self.chars += len(text)
            self.spans[text] = spans
            self.spans.move_to_end(text)
            while len(self.spans) > self.size or self.chars > self.most_chars:
                self.chars -= len(self.spans.popitem(last=False)[0])

    def clear(self) -> None:
        with self.lock:
            self.spans.clear()
            self.chars = 0


_SPLITS = _RememberedSplits(REMEMBERED_TEXTS, REMEMBERED_TOTAL)


_ONLY_REMEMBERED = threading.local()


class NotRemembered(LookupError):
    """A text would have to be split, inside only_remembered()."""


@contextmanager
def only_remembered():
    """In this block (on this thread) note_sentences splits nothing: a text not remembered raises
    NotRemembered. What a process keeps of a note is what it has split, never more."""
    _ONLY_REMEMBERED.on = True
    try:
        yield
    finally:
        _ONLY_REMEMBERED.on = False


def note_sentences(text: str) -> list[Sentence]:
    """The sentences of a note with their spans, by PyRuSH's clinical rules (medspaCy's rule file):
    "Dr.", "p.o.", "b.i.d." and numbered list items do not end or start a sentence wrongly. A
    piece that begins in lower case on the same line continues the one before it ("81 mg. daily"),
    and a list item's number stays with its item ("1. Levaquin 250 mg...")."""
    if not text.strip():
        return []
    spans = _SPLITS.get(text) if len(text) <= REMEMBERED_CHARS else None
    if spans is None:
        if getattr(_ONLY_REMEMBERED, "on", False):
            raise NotRemembered("this text was not split in this process")
        if len(text) > REMEMBERED_CHARS:
            return list(_split_sentences(text))
        spans = tuple((s.start, s.end) for s in _split_sentences(text))
        _SPLITS.put(text, spans, split_here=True)
    return [Sentence(b, e, text[b:e]) for b, e in spans]


def splits_made() -> int:
    """How many texts this process has split so far and remembered: unchanged over a question,
    it split nothing new (and there is nothing new of its notes to keep)."""
    return _SPLITS.made


def remembered_splits(texts) -> dict[str, Spans]:
    """The spans of those of `texts` split (or handed back) in this process and still remembered."""
    found = {}
    for text in texts:
        spans = _SPLITS.get(text)
        if spans is not None:
            found[text] = spans
    return found


def remember_splits(splits: dict[str, Spans]) -> None:
    """Splits made earlier (kept in the index), so note_sentences need not split these texts."""
    for text, spans in splits.items():
        if len(text) <= REMEMBERED_CHARS:
            _SPLITS.put(text, tuple((int(b), int(e)) for b, e in spans))


def forget_splits() -> None:
    """Every remembered split gone (a test that counts splitting starts from nothing)."""
    _SPLITS.clear()


def _split_sentences(text: str) -> tuple[Sentence, ...]:
    if not text.strip():
        return ()
    spans: list[list[int]] = []
    for begin, end in _rush_spans(text):
        joins = spans and "\n" not in text[spans[-1][1]:begin] and (
            text[begin:begin + 1].islower() or _LIST_NUMBER.fullmatch(text[spans[-1][0]:spans[-1][1]]))
        if joins:
            spans[-1][1] = end
        else:
            spans.append([begin, end])
    return tuple(Sentence(b, e, text[b:e]) for b, e in spans if text[b:e].strip())


@lru_cache(maxsize=1)
def _context_triggers() -> dict[str, re.Pattern]:
    """ConText's triggers (medspaCy's rule file) for a sentence about someone else (FAMILY) or
    about what may happen (HYPOTHETICAL), each rule's token pattern (or its literal) as a regular
    expression. TERMINATE rules end a context rather than start one, so they are not triggers."""
    rules = json.loads((_DATA / "context_rules.json").read_text(encoding="utf-8"))["context_rules"]
    found: dict[str, list[str]] = {"family": [], "hypothetical": [], "negated_existence": []}
    for rule in rules:
        category = rule["category"].lower()
        if category in found and rule.get("direction") != "TERMINATE" and (
                category != "negated_existence" or rule.get("direction") in ("FORWARD", "BIDIRECTIONAL")):
            found[category].append(_trigger(rule))
    return {category: re.compile(r"\b(?:" + "|".join(triggers) + r")\b", re.I) for category, triggers in found.items()}


def _trigger(rule: dict) -> str:
    if not rule.get("pattern"):
        return r"\s+".join(map(re.escape, rule["literal"].split()))
    parts = []
    for token in rule["pattern"]:
        lower = token.get("LOWER")
        words = lower.get("IN", []) if isinstance(lower, dict) else [lower]
        alternatives = "|".join(re.escape(w) for w in words if isinstance(w, str) and w.strip())
        parts.append(f"(?:\\s*(?:{alternatives}))?" if token.get("OP") == "?" else f"\\s+(?:{alternatives})")
    return "".join(parts).removeprefix("\\s+")


def sentence_context(text: str) -> set[str]:
    """"family" when a sentence speaks of a relative ("Mother had breast cancer."), "hypothetical"
    when of what may happen ("Return if chest pain recurs."), by ConText's triggers."""
    return {category for category, pattern in _context_triggers().items()
            if category != "negated_existence" and pattern.search(text)}


NEGATION_WINDOW = 5     # words between a negation and what it denies, as NegEx counts them


def denies(text: str, surface: str) -> bool:
    """The sentence denies `surface` itself: a ConText negation trigger ("no", "without",
    "negative for") stands at most NEGATION_WINDOW words before it ("without any history of
    obvious fall or trauma and past history of malignant melanoma" does not deny the melanoma)."""
    low = text.lower()
    at = low.find(surface.lower())
    if at < 0:
        return False
    before = " ".join(low[:at].split()[-NEGATION_WINDOW:])
    return _context_triggers()["negated_existence"].search(before) is not None


@lru_cache(maxsize=1)
def _known_titles() -> dict[str, str]:
    """Section titles medspaCy knows (lower case, without the colon) → their category."""
    rules = json.loads((_DATA / "section_patterns.json").read_text(encoding="utf-8"))["section_rules"]
    return {r["literal"].rstrip(":").strip().lower(): r["category"] for r in rules if r.get("literal")}


# The words a title is known by, in the order they decide ("DISCHARGE MEDICATIONS" is a medication
# list, "ASSESSMENT AND PLAN" a plan, "PAST SURGICAL HISTORY" procedures), then medspaCy's category.
_CATEGORY_KIND = {"allergy": "allergy", "allergies": "allergy", "medications": "medication",
                  "observation_and_plan": "plan", "diagnoses": "problem", "problem_list": "problem",
                  "past_medical_history": "history", "history_of_present_illness": "hpi",
                  "hospital_course": "hospital_course", "labs_and_studies": "findings", "imaging": "findings",
                  "family_history": "family_history", "social_history": "social_history",
                  "physical_exam": "physical_exam", "chief_complaint": "chief_complaint",
                  "patient_instructions": "instructions"}
_TITLE_WORDS = (("description", "narrative"), ("allerg", "allergy"), ("medication", "medication"), ("meds", "medication"),
                ("plan", "plan"), ("recommendation", "plan"), ("impression", "impression"),
                ("assessment", "impression"), ("conclusion", "impression"), ("diagnos", "problem"),
                ("procedure", "procedure"), ("operation", "procedure"), ("surgical history", "procedure"),
                ("finding", "findings"), ("laboratory", "findings"), ("labs", "findings"),
                ("hospital course", "hospital_course"), ("present illness", "hpi"), ("family history", "family_history"),
                ("social history", "social_history"), ("medical history", "history"), ("physical exam", "physical_exam"),
                ("chief complaint", "chief_complaint"), ("instruction", "instructions"), ("technique", "technique"),
                ("indication", "indication"), ("reason for", "indication"))


def section_kind(heading: str) -> str:
    """What a section heading names, as one of a few kinds the answer reads ("" when none)."""
    return next(iter(section_kinds(heading)), "")


def section_kinds(heading: str) -> list[str]:
    """Every kind a heading names, the deciding one first ("IMPRESSION/PLAN": plan, impression)."""
    title = " ".join(heading.lower().rstrip(":").split())
    kinds = [kind for word, kind in _TITLE_WORDS if word in title]
    category = _CATEGORY_KIND.get(_known_titles().get(title, ""), "")
    return list(dict.fromkeys(kinds + ([category] if category else [])))


_HEADING = re.compile(
    r"^\s*(?:#{1,6}\s*(?P<md>[^\n#].*?)|(?P<caps>[A-Z][A-Z /&\-]{2,60}):?|(?P<titled>[A-Z][A-Z0-9 /&,'()\-#.]{2,60}):)\s*$"
)
# A heading written inline, its text after it on the same line ("PLAN: She will follow up").
_INLINE = re.compile(r"^\s*(?P<title>[A-Za-z][A-Za-z /&'()\-]{1,60}?):\s+(?P<rest>\S.*)$")


def _inline_heading(line: str) -> tuple[str, str] | None:
    """(heading, rest) when a line opens with a section title that names a kind of section; an
    exam's "HEENT: normal" or a sentence's "Note: ..." stays text."""
    match = _INLINE.match(line)
    if not match:
        return None
    title = match.group("title").strip()
    known = title.lower() in _known_titles()
    if not (known or title.isupper() or len(title.split()) <= 4 and title[:1].isupper()):
        return None
    return (title, match.group("rest")) if section_kind(title) else None


def split_sections(text: str) -> list[Section]:
    """Split a note on its headings: markdown `# Heading` or ALL-CAPS `HEADING:` lines, and
    section titles written inline at the start of a line ("PLAN: She will...").

    Subheadings ("## Plan") stay inside their parent section so "Assessment and Plan" keeps its plan.
    """
    sections: list[Section] = []
    heading, lines = "", []

    def close():
        if any(l.strip() for l in lines) or heading:
            sections.append(Section(heading, _tidy("\n".join(lines)), section_kind(heading)))

    for line in text.splitlines():
        match = _HEADING.match(line)
        is_sub = line.lstrip().startswith("##")
        inline = None if match or is_sub else _inline_heading(line)
        if match and not is_sub:
            close()
            heading = (match.group("md") or match.group("caps") or match.group("titled") or "").strip().rstrip(":")
            lines = []
        elif inline:
            close()
            heading, lines = inline[0], [inline[1]]
        else:
            lines.append(line.lstrip("#").strip() if is_sub else line)
    close()
    return [s for s in sections if s.text or s.heading]


def _tidy(text: str) -> str:
    text = re.sub(r"[ \t]+", " ", text)
    text = re.sub(r"\n\s*\n+", "\n", text)
    return text.strip()
