"""Care and its plans: care plans, care teams, goals, orders and referrals (ServiceRequest), and
devices. Their facts are a name, a status and the record's details in words."""
from __future__ import annotations

from ..contract import Chunk, make_label
from ..datatypes import choice_text, concept_words, period_text, value_text
from ..facts import DetailFact, codings_of
from ..normalize import code_keys, concept_text, quantity_text, ref_id, status_code
from ..notes import html_to_text
from ..words import _join, _sentence, _strip_tag, day
from .base import Kind, Resolver, clinical_date
from .medications import reasons_of


def reference_words(resolve: Resolver, reference) -> str:
    """What a reference names: the resource this record holds, else its display."""
    if not isinstance(reference, dict):
        return ""
    target = resolve(ref_id(reference))
    if target:
        name = target.get("name")
        return concept_text(target.get("code")) or (name if isinstance(name, str) else "")
    return reference.get("display", "") if isinstance(reference.get("display"), str) else ""


def content_narrative(r: dict, structured: bool) -> str:
    """A resource's narrative when it is content: marked `additional` (it says more than the
    structured data, as US Core's CarePlan "Assessment and Plan" does), or the only content there
    is. A `generated` narrative only repeats the structure, and is left out."""
    text = r.get("text") if isinstance(r.get("text"), dict) else {}
    div = text.get("div")
    if not isinstance(div, str) or not div or (structured and text.get("status") != "additional"):
        return ""
    return " ".join(html_to_text(div).split())


def detail_fact(kind: str, r: dict, name: str, concept, details: list[tuple[str, str]], status: str = "") -> DetailFact:
    return DetailFact(kind=kind, name=name, codes=codings_of(concept), date=clinical_date(r),
                      status=status or str(r.get("status") or ""),
                      notes=_join((n.get("text", "") for n in r.get("note") or [] if isinstance(n, dict)), " "),
                      details=[[label, words] for label, words in details if words])


# --- care plans ---------------------------------------------------------------------------------

def careplan_parts(r: dict, resolve: Resolver) -> dict:
    categories = _join(concept_text(c) for c in r.get("category") or [] if concept_text(c))
    activities = _join(concept_text((a.get("detail") or {}).get("code")) for a in r.get("activity") or [])
    addresses = _join(concept_text((resolve(ref_id(x)) or {}).get("code")) for x in r.get("addresses") or [])
    title = r.get("title") or r.get("description") or ""
    narrative = content_narrative(r, structured=bool(categories or title or activities or addresses))
    return {"categories": categories, "activities": activities, "addresses": addresses, "title": title,
            "narrative": narrative}


def careplan_fact(r: dict, resolve: Resolver) -> DetailFact:
    p = careplan_parts(r, resolve)
    return detail_fact("careplan", r, p["title"] or p["categories"], (r.get("category") or [None])[0],
                       [("category", p["categories"]), ("addresses", p["addresses"]), ("activities", p["activities"]),
                        ("plan", p["narrative"]), ("period", period_text(r.get("period")))])


def render_careplan(chunker, r) -> list[Chunk]:
    when = day(clinical_date(r))
    p = careplan_parts(r, chunker.resolve)
    categories, title, narrative = p["categories"], p["title"], p["narrative"]
    text = _sentence(f"Care plan ({r.get('status', '')})" + (f" from {when}:" if when else ":"),
                     f"{_join([categories, title], '. ')}." if categories or title else "",
                     f"Addresses: {p['addresses']}." if p["addresses"] else "",
                     f"Activities: {p['activities']}." if p["activities"] else "",
                     f"Plan: {narrative}" if narrative and narrative not in (categories, title) else "")
    return [chunker.new_chunk(r, "0", text, make_label(when, "Care plan", _strip_tag(categories)), "careplan",
                              status=r.get("status", ""))]


# --- devices ------------------------------------------------------------------------------------

def device_name(r: dict) -> str:
    return concept_text(r.get("type")) or _join(n.get("name", "") for n in r.get("deviceName") or [])


def device_fact(r: dict, resolve: Resolver) -> DetailFact:
    return detail_fact("device", r, device_name(r), r.get("type"),
                       [("manufactured", day(r.get("manufactureDate") or "")),
                        ("expires", day(r.get("expirationDate") or "")),
                        ("identifier", _join(u.get("deviceIdentifier", "") for u in r.get("udiCarrier") or []
                                             if isinstance(u, dict)))])


def render_device(chunker, r) -> list[Chunk]:
    name = device_name(r)
    when = day(clinical_date(r))
    text = _sentence(f"Device ({r.get('status', '')}):", f"{name}.", f"Manufactured {when}." if when else "")
    return [chunker.new_chunk(r, "0", text, make_label(when, "Device", _strip_tag(name)), "device",
                              codes=code_keys(r.get("type")), status=r.get("status", ""))]


# --- orders, goals, care teams --------------------------------------------------------------------

def order_fact(r: dict, resolve: Resolver) -> DetailFact:
    return detail_fact("order", r, concept_text(r.get("code")), r.get("code"),
                       [("intent", str(r.get("intent") or "")), ("scheduled", choice_text(r, "occurrence")),
                        ("category", _join(concept_text(c) for c in r.get("category") or [])),
                        ("reason", _join(reasons_of(r, resolve))),
                        ("to", _join(reference_words(resolve, p) for p in r.get("performer") or [])),
                        ("instructions", r["patientInstruction"] if isinstance(r.get("patientInstruction"), str) else "")])


def goal_fact(r: dict, resolve: Resolver) -> DetailFact:
    targets = _join((goal_target(t) for t in r.get("target") or [] if isinstance(t, dict)), "; ")
    return detail_fact("goal", r, concept_text(r.get("description")), r.get("description"),
                       [("target", targets), ("achievement", status_code(r, "achievementStatus")),
                        ("addresses", _join(reference_words(resolve, x) for x in r.get("addresses") or []))],
                       status=str(r.get("lifecycleStatus") or ""))


def careteam_fact(r: dict, resolve: Resolver) -> DetailFact:
    members = [_sentence(reference_words(resolve, p.get("member")),
                         f"({_join(concept_text(c) for c in p.get('role') or [])})" if p.get("role") else "")
               for p in r.get("participant") or [] if isinstance(p, dict)]
    name = r.get("name") if isinstance(r.get("name"), str) else ""
    return detail_fact("careteam", r, name or "care team", None,
                       [("members", _join(members, "; ")), ("period", period_text(r.get("period")))])


def render_order(chunker, r) -> list[Chunk]:
    """An order or referral: a lab, imaging, a consult, a DNR order, a social-service referral."""
    name = concept_words(r.get("code"))
    status, intent = r.get("status", ""), r.get("intent", "")
    when = day(clinical_date(r))
    occurrence = choice_text(r, "occurrence")
    categories = _join(concept_text(c) for c in r.get("category") or [])
    reason = chunker.reason_text(r)
    performer = _join(reference_words(chunker.resolve, p) for p in r.get("performer") or [])
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


def render_goal(chunker, r) -> list[Chunk]:
    description = concept_words(r.get("description"))
    status = _join([r.get("lifecycleStatus", ""), status_code(r, "achievementStatus")])
    when = day(clinical_date(r))
    targets = _join((goal_target(t) for t in r.get("target") or [] if isinstance(t, dict)), "; ")
    addresses = _join(reference_words(chunker.resolve, x) for x in r.get("addresses") or [])
    text = _sentence(f"Goal ({status})" + (f" from {when}:" if when else ":"), f"{description}.",
                     f"Target: {targets}." if targets else "", f"Addresses: {addresses}." if addresses else "",
                     chunker.notes_text(r))
    return [chunker.new_chunk(r, "0", text, make_label(when, "Goal", concept_text(r.get("description"))), "goal",
                              codes=code_keys(r.get("description")), status=r.get("lifecycleStatus", ""))]


def render_careteam(chunker, r) -> list[Chunk]:
    members = []
    for p in r.get("participant") or []:
        if not isinstance(p, dict):
            continue
        role = _join(concept_text(c) for c in p.get("role") or [])
        who = reference_words(chunker.resolve, p.get("member"))
        members.append(_sentence(who, f"({role})" if role else "") or role)
    name = r.get("name") if isinstance(r.get("name"), str) else ""
    text = _sentence(f"Care team ({r.get('status', '')}):", f"{name}." if name else "",
                     f"Members: {_join(members, '; ')}." if members else "",
                     f"Period {period_text(r.get('period'))}." if period_text(r.get("period")) else "")
    return [chunker.new_chunk(r, "0", text, make_label(day(clinical_date(r)), "Care team", name or "care team"),
                              "careteam", status=r.get("status", ""))]



# --- diet orders ----------------------------------------------------------------------------------

def nutrition_parts(r: dict, resolve: Resolver) -> list[tuple[str, str]]:
    """A diet order's parts as (label, words): the oral diet, its textures and fluids, supplements,
    tube feeding, and what it keeps out."""
    oral = r.get("oralDiet") if isinstance(r.get("oralDiet"), dict) else {}
    feeding = r.get("enteralFormula") if isinstance(r.get("enteralFormula"), dict) else {}
    supplements = [s for s in r.get("supplement") or [] if isinstance(s, dict)]
    return [("diet", _join(concept_text(t) for t in oral.get("type") or [])),
            ("texture", _join(concept_text(t.get("modifier")) for t in oral.get("texture") or [] if isinstance(t, dict))),
            ("fluids", _join(concept_text(f) for f in oral.get("fluidConsistencyType") or [])),
            ("instructions", oral.get("instruction") if isinstance(oral.get("instruction"), str) else ""),
            ("supplement", _join(concept_text(x.get("type")) or str(x.get("productName") or "") for x in supplements)),
            ("tube feeding", concept_text(feeding.get("baseFormulaType")) or str(feeding.get("baseFormulaProductName") or "")),
            ("excludes", _join(concept_text(x) for x in r.get("excludeFoodModifier") or [])),
            ("food preferences", _join(concept_text(x) for x in r.get("foodPreferenceModifier") or [])),
            ("allergies considered", _join(reference_words(resolve, x) for x in r.get("allergyIntolerance") or []))]


def nutrition_name(parts: list[tuple[str, str]]) -> str:
    named = dict(parts)
    return named["diet"] or named["tube feeding"] or "diet order"


def nutrition_fact(r: dict, resolve: Resolver) -> DetailFact:
    oral = (r.get("oralDiet") or {}).get("type") if isinstance(r.get("oralDiet"), dict) else None
    parts = nutrition_parts(r, resolve)
    return detail_fact("diet", r, nutrition_name(parts), (oral or [None])[0],
                       [(label, words) for label, words in parts if label != "diet"]
                       + [("intent", str(r.get("intent") or ""))])


def render_nutrition(chunker, r) -> list[Chunk]:
    """A diet order (NutritionOrder): what the patient may eat and drink is clinical."""
    when = day(clinical_date(r))
    status = _join([r.get("status", ""), r.get("intent", "")])
    every = nutrition_parts(r, chunker.resolve)
    parts = [(label, words) for label, words in every if words]
    text = _sentence(f"Diet order ({status})" + (f" on {when}:" if when else ":"),
                     *(f"{label.capitalize()}: {words}." for label, words in parts), chunker.notes_text(r))
    oral = (r.get("oralDiet") or {}).get("type") if isinstance(r.get("oralDiet"), dict) else []
    return [chunker.new_chunk(r, "0", text, make_label(when, "Diet", _strip_tag(nutrition_name(every))), "order",
                              category="diet", codes=code_keys(*(oral or [])), status=r.get("status", ""))]


KINDS = [
    Kind("CarePlan", "care", ("period", "created"), render_careplan, careplan_fact, title="category"),
    Kind("CareTeam", "care", ("period",), render_careteam, careteam_fact),
    Kind("Goal", "care", ("startDate", "statusDate"), render_goal, goal_fact, title="description"),
    Kind("ServiceRequest", "care", ("occurrenceDateTime", "occurrencePeriod", "authoredOn"), render_order, order_fact,
         title="code"),
    Kind("Device", "care", ("manufactureDate",), render_device, device_fact, title="type"),
    Kind("NutritionOrder", "care", ("dateTime",), render_nutrition, nutrition_fact),
]
