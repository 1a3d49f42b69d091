"""Renderers for the clinical resource types beyond Synthea's: what a patient says they take
(MedicationStatement), what the pharmacy handed over (MedicationDispense), orders and referrals
(ServiceRequest), goals, family history, questionnaire answers (PHQ-9 and other instruments),
composed notes in sections (Composition), insurance (Coverage), the care team, and media.

Each takes the patient's chunker (for references, shared renderers and `new_chunk`) and one
resource, and returns its chunks. Rendered by the FHIR R4 specification, not by one sample.
"""
from __future__ import annotations

from .contract import Chunk, make_label
from .datatypes import choice_text, comparator_quantity, concept_words, period_text, value_text
from .normalize import code_keys, concept_text, quantity_text, ref_id, status_code
from .words import _join, _sentence, _strip_tag, clinical_date, day


def reference_words(chunker, reference) -> str:
    """What a reference names: the resource this record holds, else its display."""
    if not isinstance(reference, dict):
        return ""
    target = chunker.by_ref.get(ref_id(reference))
    if target:
        name = target.get("name")
        return concept_text(target.get("code")) or (name if isinstance(name, str) else "")
    return reference.get("display", "") if isinstance(reference.get("display"), str) else ""


def medication_statement(chunker, r) -> list[Chunk]:
    drug, codes, extra = chunker.medication_concept(r)
    status = r.get("status", "")
    when = day(clinical_date(r))
    taken = period_text(r.get("effectivePeriod")) if r.get("effectivePeriod") else ""
    reason = chunker.reason_text(r)
    text = _sentence(
        f"Medication statement ({status})" + (f" on {when}:" if when else ":"), f"{drug}.",
        f"Taken {taken}." if taken else "",
        f"Dosage: {chunker.dosage_text(r.get('dosage'))}." if r.get("dosage") else "",
        f"Reason: {reason}." if reason else "",
        f"Status reason: {_join(concept_text(c) for c in r.get('statusReason') or [])}." if r.get("statusReason") else "",
        chunker.notes_text(r),
    )
    label = make_label(when, "Med", f"{drug} ({status}, reported)" if status else drug)
    return [chunker.new_chunk(r, "0", text, label, "medication", category="statement", codes=codes,
                              refs=extra + chunker.reason_refs(r), status=status)]


def medication_dispense(chunker, r) -> list[Chunk]:
    drug, codes, extra = chunker.medication_concept(r)
    status = r.get("status", "")
    when = day(clinical_date(r))
    orders = [ref_id(x) for x in r.get("authorizingPrescription") or [] if ref_id(x) in chunker.by_ref]
    text = _sentence(
        f"Medication dispensed ({status})" + (f" on {when}:" if when else ":"), f"{drug}.",
        f"Quantity {quantity_text(r.get('quantity'))}." if quantity_text(r.get("quantity")) else "",
        f"Days supply {quantity_text(r.get('daysSupply'))}." if quantity_text(r.get("daysSupply")) else "",
        f"Dosage: {chunker.dosage_text(r.get('dosageInstruction'))}." if r.get("dosageInstruction") else "",
        f"Type: {concept_text(r.get('type'))}." if concept_text(r.get("type")) else "",
        chunker.notes_text(r),
    )
    return [chunker.new_chunk(r, "0", text, make_label(when, "Dispensed", drug), "medication", category="dispense",
                              codes=codes, refs=extra + orders, status=status)]


def service_request(chunker, r) -> list[Chunk]:
    """An order or referral: a lab, imaging, a consult, a DNR order, a social-service referral."""
    name = concept_words(r.get("code"))
    status, intent = r.get("status", ""), r.get("intent", "")
    when = day(clinical_date(r))
    occurrence = choice_text(r, "occurrence")
    categories = _join(concept_text(c) for c in r.get("category") or [])
    reason = chunker.reason_text(r)
    performer = _join(reference_words(chunker, p) for p in r.get("performer") or [])
    text = _sentence(
        f"Order / referral ({_join([status, intent])})" + (f" on {day(r.get('authoredOn') or '') or when}:" if when else ":"),
        f"{name}." if name else "",
        f"Category: {categories}." if categories else "",
        f"Scheduled {occurrence}." if occurrence and occurrence != day(r.get("authoredOn") or "") else "",
        f"Priority: {r['priority']}." if isinstance(r.get("priority"), str) and r["priority"] != "routine" else "",
        f"Reason: {reason}." if reason else "",
        f"To: {performer}." if performer else "",
        f"Instructions: {r['patientInstruction']}." if isinstance(r.get("patientInstruction"), str) else "",
        chunker.notes_text(r),
    )
    return [chunker.new_chunk(r, "0", text, make_label(when, "Order", _strip_tag(concept_text(r.get("code")))), "order",
                              category=categories, codes=code_keys(r.get("code")), refs=chunker.reason_refs(r),
                              status=status)]


def goal_target(target: dict) -> str:
    measure = concept_text(target.get("measure"))
    detail = value_text({k.replace("detail", "value"): v for k, v in target.items() if k.startswith("detail")})
    due = day(target.get("dueDate") or "") or (
        f"within {quantity_text(target['dueDuration'])}" if isinstance(target.get("dueDuration"), dict) else "")
    return _sentence(f"{measure}:" if measure and detail else measure, detail,
                     f"by {due}" if due and not due.startswith("within") else due)


def goal(chunker, r) -> list[Chunk]:
    description = concept_words(r.get("description"))
    status = _join([r.get("lifecycleStatus", ""), status_code(r, "achievementStatus")])
    when = day(clinical_date(r))
    targets = _join((goal_target(t) for t in r.get("target") or [] if isinstance(t, dict)), "; ")
    addresses = _join(reference_words(chunker, x) for x in r.get("addresses") or [])
    text = _sentence(f"Goal ({status})" + (f" from {when}:" if when else ":"), f"{description}.",
                     f"Target: {targets}." if targets else "", f"Addresses: {addresses}." if addresses else "",
                     chunker.notes_text(r))
    return [chunker.new_chunk(r, "0", text, make_label(when, "Goal", concept_text(r.get("description"))), "goal",
                              codes=code_keys(r.get("description")), status=r.get("lifecycleStatus", ""))]


def family_member_history(chunker, r) -> list[Chunk]:
    relative = concept_text(r.get("relationship")) or "relative"
    when = day(clinical_date(r))
    conditions = []
    for item in r.get("condition") or []:
        if not isinstance(item, dict):
            continue
        onset = choice_text(item, "onset")
        outcome = concept_text(item.get("outcome"))
        conditions.append(_sentence(concept_words(item.get("code")), f"(onset {onset})" if onset else "",
                                    f"outcome {outcome}" if outcome else ""))
    deceased = choice_text(r, "deceased")
    text = _sentence(
        f"Family history ({r.get('status', '')})" + (f" recorded {when}:" if when else ":"), f"{relative}:",
        f"{_join(conditions, '; ')}." if conditions else "no conditions recorded.",
        f"Deceased {deceased}." if deceased and deceased != "no" else "", chunker.notes_text(r),
    )
    codes = code_keys(*(c.get("code") for c in r.get("condition") or [] if isinstance(c, dict)))
    return [chunker.new_chunk(r, "0", text, make_label(when, "Family hx", f"{relative}: {_join(concept_text(c.get('code')) for c in r.get('condition') or [] if isinstance(c, dict))}"),
                              "family-history", codes=codes, status=r.get("status", ""))]


def answer_words(answer: dict) -> str:
    if not isinstance(answer, dict):
        return ""
    coding = answer.get("valueCoding")
    if isinstance(coding, dict):
        return coding.get("display") or coding.get("code") or ""
    for kind in ("Decimal", "Integer", "String", "Date", "DateTime", "Time", "Uri"):
        if f"value{kind}" in answer:
            return str(answer[f"value{kind}"])
    if isinstance(answer.get("valueQuantity"), dict):
        return comparator_quantity(answer["valueQuantity"])
    if "valueBoolean" in answer:
        return "yes" if answer["valueBoolean"] is True else "no"
    if isinstance(answer.get("valueReference"), dict):
        return answer["valueReference"].get("display", "")
    return ""


def questionnaire_items(items: list, out: list[str]) -> None:
    """'Question: answer' for every answered item, groups' items in order, nested answers included."""
    for item in items or []:
        if not isinstance(item, dict):
            continue
        answers = [a for a in item.get("answer") or [] if isinstance(a, dict)]
        words = _join(answer_words(a) for a in answers)
        question = item.get("text") or item.get("linkId") or ""
        if words:
            out.append(f"{question.rstrip('?:')}: {words}")
        questionnaire_items(item.get("item") or [], out)
        for answer in answers:
            questionnaire_items(answer.get("item") or [], out)


def questionnaire_response(chunker, r) -> list[Chunk]:
    when = day(clinical_date(r))
    source = r.get("questionnaire") if isinstance(r.get("questionnaire"), str) else ""
    name = source.rstrip("/").rsplit("/", 1)[-1].split("|")[0] if source else "questionnaire"
    lines: list[str] = []
    questionnaire_items(r.get("item") or [], lines)
    text = _sentence(f"Questionnaire response ({r.get('status', '')})" + (f" on {when}:" if when else ":"),
                     f"{name}.", "; ".join(lines) + "." if lines else "no answers recorded.")
    return [chunker.new_chunk(r, "0", text, make_label(when, "Survey", name), "survey", category="questionnaire",
                              status=r.get("status", ""))]


def composition(chunker, r) -> list[Chunk]:
    """A composed note (a progress note, a discharge summary): its sections as headings."""
    from .notes import html_to_text

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


def coverage(chunker, r) -> list[Chunk]:
    payors = _join(reference_words(chunker, p) for p in r.get("payor") or [])
    plan = concept_words(r.get("type"))
    period = period_text(r.get("period"))
    classes = _join(f"{concept_text(c.get('type'))} {c.get('name') or c.get('value') or ''}".strip()
                    for c in r.get("class") or [] if isinstance(c, dict))
    relationship = concept_text(r.get("relationship"))
    text = _sentence(f"Insurance coverage ({r.get('status', '')}):", f"{plan}." if plan else "",
                     f"Payer: {payors}." if payors else "", f"Plan: {classes}." if classes else "",
                     f"Valid {period}." if period else "",
                     f"Subscriber relationship: {relationship}." if relationship else "")
    return [chunker.new_chunk(r, "0", text, make_label(day(clinical_date(r)), "Coverage", payors or plan), "coverage",
                              status=r.get("status", ""))]


def care_team(chunker, r) -> list[Chunk]:
    members = []
    for p in r.get("participant") or []:
        if not isinstance(p, dict):
            continue
        role = _join(concept_text(c) for c in p.get("role") or [])
        who = reference_words(chunker, p.get("member"))
        members.append(_sentence(who, f"({role})" if role else "") or role)
    name = r.get("name") if isinstance(r.get("name"), str) else ""
    text = _sentence(f"Care team ({r.get('status', '')}):", f"{name}." if name else "",
                     f"Members: {_join(members, '; ')}." if members else "",
                     f"Period {period_text(r.get('period'))}." if period_text(r.get("period")) else "")
    return [chunker.new_chunk(r, "0", text, make_label(day(clinical_date(r)), "Care team", name or "care team"),
                              "careteam", status=r.get("status", ""))]


def media(chunker, r) -> list[Chunk]:
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


RENDERERS = {
    "MedicationStatement": medication_statement, "MedicationDispense": medication_dispense,
    "ServiceRequest": service_request, "Goal": goal, "FamilyMemberHistory": family_member_history,
    "QuestionnaireResponse": questionnaire_response, "Composition": composition, "Coverage": coverage,
    "CareTeam": care_team, "Media": media,
}
