"""Notes and reports wherever they live: DocumentReference and DiagnosticReport attachments (inline
or as Binary: plain text, HTML, XHTML, RTF, PDF, CDA), Composition sections, a report's results
panel and its conclusion, and Media. A note is split on its headings into chunks that fit the
embedding model's window, never mixing two notes."""
from __future__ import annotations

from ..contract import Chunk, make_label
from ..datatypes import concept_words
from ..facts import DetailFact, NoteFact, SeriesFact, codings_of
from ..normalize import code_keys, concept_text, ref_id
from ..notes import html_to_text
from ..words import _join, _sentence, day
from .base import Kind, Resolver, clinical_date
from .observations import observation_value, point_of


def note_type_of(r: dict) -> str:
    if r["resourceType"] == "Composition":
        return concept_words(r.get("type")) or r.get("title") or "Clinical note"
    if r["resourceType"] == "DiagnosticReport":
        return concept_words(r.get("code")) or "Report"
    return concept_words(r.get("type")) or "Clinical note"


def note_fact(r: dict, resolve: Resolver) -> NoteFact:
    """A note: its type and date (each chunk of it adds the sections it holds)."""
    concept = r.get("code") if r["resourceType"] == "DiagnosticReport" else r.get("type")
    return NoteFact(name=note_type_of(r), codes=codings_of(concept), date=clinical_date(r),
                    status=str(r.get("status") or ""), note_type=note_type_of(r))


def report_fact(r: dict, resolve: Resolver) -> DetailFact:
    coded = _join(concept_words(c) for c in r.get("conclusionCode") or [])
    return DetailFact(kind="report", name=concept_text(r.get("code")), codes=codings_of(r.get("code")),
                      date=clinical_date(r), status=str(r.get("status") or ""),
                      details=[[label, words] for label, words in
                               (("conclusion", r.get("conclusion") if isinstance(r.get("conclusion"), str) else ""),
                                ("coded conclusion", coded)) if words])


def panel_fact(r: dict, results: list[dict]) -> SeriesFact:
    return SeriesFact(name=concept_text(r.get("code")), codes=codings_of(r.get("code")), date=clinical_date(r),
                      status=str(r.get("status") or ""), points=[point_of(o) for o in results])


def media_fact(r: dict, resolve: Resolver) -> DetailFact:
    content = (r.get("content") or {}) if isinstance(r.get("content"), dict) else {}
    kind = concept_text(r.get("type")) or concept_text(r.get("modality")) or "media"
    return DetailFact(kind="media", name=kind, codes=codings_of(r.get("type")), date=clinical_date(r),
                      status=str(r.get("status") or ""),
                      details=[[label, words] for label, words in
                               (("title", content.get("title") if isinstance(content.get("title"), str) else ""),
                                ("view", concept_text(r.get("view"))), ("body site", concept_text(r.get("bodySite"))),
                                ("reason", _join(concept_text(c) for c in r.get("reasonCode") or []))) if words])


def render_document(chunker, r) -> list[Chunk]:
    note_type = concept_words(r.get("type")) or "Clinical note"
    when = day(clinical_date(r))
    attachments = [c.get("attachment") for c in r.get("content") or [] if isinstance(c, dict)]
    texts, reasons = chunker.readable_attachments(r, attachments)
    enc = ref_id((r.get("context") or {}).get("encounter", [{}])[0] if (r.get("context") or {}).get("encounter") else None)
    refs = [enc] if enc in chunker.by_ref else []
    if texts:    # the same note in several formats: the first readable one is the note
        return chunker.note_chunks(r, texts[0], note_type, when, "note", refs=refs)
    # The note exists even when its text cannot be read: say so where a clinician will look.
    ref = f"DocumentReference/{r['id']}"
    chunker.problem(ref, "note text could not be read: " + "; ".join(reasons or ["no attachment"]))
    description = r.get("description") or ""
    linked = any(isinstance(a, dict) and a.get("url") and not a.get("data") for a in attachments)
    text = _sentence(f"{note_type}" + (f" of {when}" if when else "") + ":", f"{description}." if description else "",
                     f"Status: {r.get('docStatus')}." if isinstance(r.get("docStatus"), str) else "",
                     "Its text was not included: it is behind a link this input does not hold." if linked
                     else "Its text could not be read from the record.")
    return [chunker.new_chunk(r, "0", text, make_label(when, "Note", note_type), "note", category=note_type,
                           refs=refs, status=r.get("status", ""))]


def render_report(chunker, r) -> list[Chunk]:
    """The result panel, the conclusion (with its codes) and each presented form, each kept when
    another part cannot be read."""
    ref = f"DiagnosticReport/{r['id']}"
    if ref in chunker.note_twins:
        return []  # the same note is indexed once, through its DocumentReference
    name = concept_words(r.get("code"))
    when = day(clinical_date(r))
    chunks = []
    results = [chunker.by_ref.get(ref_id(x)) for x in r.get("result") or []]
    results = [x for x in results if x]
    if results:
        values = [f"{concept_text(o.get('code'))} {observation_value(o)}" for o in results]
        text = _sentence(f"Lab panel / report on {when}:" if when else "Lab panel / report:", f"{name}.",
                         "Results: " + "; ".join(values) + ".")
        chunks.append(chunker.new_chunk(
            r, "0", text, make_label(when, "Panel", concept_text(r.get("code"))), "lab", category="panel",
            codes=code_keys(r.get("code")), refs=[f"Observation/{o['id']}" for o in results],
            status=r.get("status", ""), fact=panel_fact(r, results)))
    texts, reasons = chunker.readable_attachments(r, r.get("presentedForm") or [])
    for i, text in enumerate(texts[:1]):
        chunks.extend(chunker.note_chunks(r, text, name or "Report", when, "note", part_prefix=f"form{i}-"))
    if reasons and not texts:
        chunker.problem(ref, "report text could not be read: " + "; ".join(reasons)
                        + "; its coded parts, results and conclusion are indexed without it")
    coded = _join(concept_words(c) for c in r.get("conclusionCode") or [])
    if r.get("conclusion") or coded:
        text = _sentence(f"Report on {when}:" if when else "Report:", f"{name}.",
                         f"Conclusion: {r['conclusion']}" if r.get("conclusion") else "",
                         f"Coded conclusion: {coded}." if coded else "")
        chunks.append(chunker.new_chunk(r, "conclusion" if chunks else "0", text,
                                     make_label(when, "Report", concept_text(r.get("code"))), "note",
                                     codes=code_keys(*(r.get("conclusionCode") or [])), status=r.get("status", "")))
    if not chunks:
        chunks.append(report_without_text(chunker, r, name, when))
    return chunks


def report_without_text(chunker, r, name: str, when: str) -> Chunk:
    """A report whose text this input does not hold (behind a URL a file cannot fetch) and that
    has no results or conclusion: its coded parts are indexed, and it says its text is not."""
    categories = _join(concept_text(c) for c in r.get("category") or [])
    issued = day(r["issued"]) if isinstance(r.get("issued"), str) else ""
    text = _sentence(f"Report ({r.get('status', '')})" + (f" on {when}:" if when else ":"), f"{name or 'Report'}.",
                     f"Category: {categories}." if categories else "",
                     f"Issued {issued}." if issued and issued != when else "",
                     "Its text was not included: it is behind a link this input does not hold.")
    # Not a "note": it holds no text to quote, so an answer states the report's own parts.
    return chunker.new_chunk(r, "0", text, make_label(when, "Report", concept_text(r.get("code"))), "report",
                             category=categories, codes=code_keys(r.get("code")), status=r.get("status", ""))


def render_composition(chunker, r) -> list[Chunk]:
    """A composed note (a progress note, a discharge summary): its sections as headings."""
    note_type = concept_words(r.get("type")) or r.get("title") or "Clinical note"
    when = day(clinical_date(r))
    parts: list[str] = []

    def walk(sections):
        for section in sections or []:
            if not isinstance(section, dict):
                continue
            title = section.get("title") or concept_text(section.get("code"))
            if title:
                parts.append(f"# {title}")
            div = (section.get("text") or {}).get("div") if isinstance(section.get("text"), dict) else ""
            if isinstance(div, str) and div:
                parts.append(html_to_text(div))
            walk(section.get("section"))

    walk(r.get("section"))
    if not parts:
        div = (r.get("text") or {}).get("div", "") if isinstance(r.get("text"), dict) else ""
        parts.append(html_to_text(div) if div else "no sections recorded")
    encounter = ref_id(r.get("encounter"))
    return chunker.note_chunks(r, "\n".join(parts), note_type, when, "note",
                               refs=[encounter] if encounter in chunker.by_ref else [])


def render_media(chunker, r) -> list[Chunk]:
    when = day(clinical_date(r))
    kind = concept_text(r.get("type")) or concept_text(r.get("modality")) or "media"
    view = concept_text(r.get("view"))
    body = concept_text(r.get("bodySite"))
    reason = _join(concept_text(c) for c in r.get("reasonCode") or [])
    content = (r.get("content") or {}) if isinstance(r.get("content"), dict) else {}
    title = content.get("title") if isinstance(content.get("title"), str) else ""
    text = _sentence(f"Media ({r.get('status', '')})" + (f" on {when}:" if when else ":"), f"{kind}.",
                     f"{title}." if title else "", f"View: {view}." if view else "",
                     f"Body site: {body}." if body else "", f"Reason: {reason}." if reason else "",
                     chunker.notes_text(r))
    return [chunker.new_chunk(r, "0", text, make_label(when, "Media", title or kind), "imaging",
                              status=r.get("status", ""))]



KINDS = [
    Kind("DocumentReference", "documents", ("context", "date"), render_document, note_fact, title="type"),
    Kind("DiagnosticReport", "documents", ("effectiveDateTime", "effectivePeriod", "issued"), render_report,
         report_fact, title="code"),
    Kind("Composition", "documents", ("date",), render_composition, note_fact, title="type"),
    Kind("Media", "documents", ("createdDateTime", "createdPeriod", "issued"), render_media, media_fact, title="type"),
    Kind("Binary", "documents", search=None),        # a note's content, read through its attachment's URL
]
