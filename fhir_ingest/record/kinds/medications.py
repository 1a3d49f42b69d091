"""Medications: what was ordered (MedicationRequest), given (MedicationAdministration), taken by the
patient's account (MedicationStatement) and handed over (MedicationDispense), and the Medication
they may point at instead of naming the drug themselves."""
from __future__ import annotations

from ..contract import Chunk, make_label
from ..datatypes import comparator_quantity, dosage_text, frequency_text, period_text, range_text, ratio_text, timing_text
from ..facts import Dose, MedicationFact, codings_of, quantity_of, range_of, Value
from ..normalize import code_keys, concept_text, contained, quantity_text, ref_id
from ..words import _join, _sentence, day
from .base import Kind, Resolver, clinical_date


def medication_of(r: dict, resolve: Resolver) -> tuple[str, dict | None, str]:
    """(drug name, its CodeableConcept, the Medication's ref) from medicationCodeableConcept, a
    referenced Medication this record holds, a contained one, or the reference's display."""
    if r.get("medicationCodeableConcept"):
        mcc = r["medicationCodeableConcept"]
        return concept_text(mcc), mcc, ""
    med_ref = ref_id(r.get("medicationReference"))
    med = resolve(med_ref) if med_ref else None
    med = med or contained(r, r.get("medicationReference"))
    if med:
        return concept_text(med.get("code")), med.get("code"), med_ref
    display = (r.get("medicationReference") or {}).get("display", "")
    return display or "unknown medication", None, med_ref


def reasons_of(r: dict, resolve: Resolver) -> list[str]:
    """reasonCode and reasonReference by the specification (the referenced record's name)."""
    reasons = [concept_text(c) for c in r.get("reasonCode") or []]
    for x in r.get("reasonReference") or []:
        target = resolve(ref_id(x)) if isinstance(x, dict) else None
        reasons.append(concept_text((target or {}).get("code")) or (x.get("display", "") if isinstance(x, dict) else ""))
    return [x for x in dict.fromkeys(reasons) if x]


def visit_reasons(r: dict, resolve: Resolver) -> tuple[list[str], str, str]:
    """(reasons, the visit's date, its ref) of the visit an order was placed at, for an order that
    states no reason of its own ("Why is she getting B12 shots?" is answered by that visit)."""
    enc_ref = ref_id(r.get("encounter"))
    enc = resolve(enc_ref) if enc_ref else None
    if not enc:
        return [], "", ""
    return reasons_of(enc, resolve), day(clinical_date(enc)), enc_ref


def dose_of(dosage: dict) -> Dose:
    amount, rate = None, ""
    for dose_rate in dosage.get("doseAndRate") or []:
        if not isinstance(dose_rate, dict):
            continue
        quantity = quantity_of(dose_rate.get("doseQuantity"))
        amount = amount or (Value("quantity", quantity.text, quantity=quantity) if quantity else range_of(dose_rate.get("doseRange")))
        rate = rate or comparator_quantity(dose_rate.get("rateQuantity")) or range_text(dose_rate.get("rateRange")) \
            or ratio_text(dose_rate.get("rateRatio"))
    # A MedicationAdministration's dosage holds its dose and rate directly, not in doseAndRate.
    quantity = quantity_of(dosage.get("dose"))
    amount = amount or (Value("quantity", quantity.text, quantity=quantity) if quantity else None)
    rate = rate or comparator_quantity(dosage.get("rateQuantity")) or ratio_text(dosage.get("rateRatio"))
    as_needed = ""
    if isinstance(dosage.get("asNeededCodeableConcept"), dict):
        as_needed = f"as needed for {concept_text(dosage['asNeededCodeableConcept'])}"
    elif dosage.get("asNeededBoolean"):
        as_needed = "as needed"
    most = dosage.get("maxDosePerPeriod")      # one Ratio in R4, a list in R5
    maximum = "; ".join("max " + ratio_text(x).replace(" / ", " per ")
                        for x in (most if isinstance(most, list) else [most] if isinstance(most, dict) else []))
    text = dosage.get("text") if isinstance(dosage.get("text"), str) else ""
    return Dose(text, amount, timing_text(dosage.get("timing")), frequency_text(dosage.get("timing")), as_needed,
                concept_text(dosage.get("route")) if isinstance(dosage.get("route"), dict) else "", maximum, rate)


def doses_of(dosages) -> list[Dose]:
    return [dose_of(d) for d in dosages or [] if isinstance(d, dict)] if isinstance(dosages, list) else \
        [dose_of(dosages)] if isinstance(dosages, dict) else []


def medication_fact(r: dict, resolve: Resolver) -> MedicationFact:
    name, concept, _ = medication_of(r, resolve)
    rt = r["resourceType"]
    form = {"MedicationRequest": "order", "MedicationStatement": "statement", "MedicationDispense": "dispense",
            "MedicationAdministration": "administration"}[rt]
    dosages = r.get("dosageInstruction") if rt in ("MedicationRequest", "MedicationDispense") else r.get("dosage")
    if rt == "MedicationDispense" and not dosages:
        dosages = order_dosages(r, resolve)[0]
    own = reasons_of(r, resolve)
    visit = visit_reasons(r, resolve)[0] if not own and rt == "MedicationRequest" else []
    period = {"MedicationRequest": period_text((r.get("dispenseRequest") or {}).get("validityPeriod")),
              "MedicationStatement": period_text(r.get("effectivePeriod")),
              "MedicationAdministration": period_text(r.get("effectivePeriod"))}.get(rt, "")
    quantity = _join([quantity_text(r.get("quantity")), f"{quantity_text(r.get('daysSupply'))} supply"
                      if quantity_text(r.get("daysSupply")) else ""])
    return MedicationFact(
        name=name, codes=codings_of(concept), date=clinical_date(r), status=str(r.get("status") or ""),
        notes=_join((n.get("text", "") for n in r.get("note") or [] if isinstance(n, dict)), " "),
        medication=name, form=form, doses=doses_of(dosages), reasons=own, visit_reasons=visit,
        status_reason=_join(concept_text(c) for c in (r.get("statusReason") if isinstance(r.get("statusReason"), list)
                                                      else [r.get("statusReason")]) if isinstance(c, dict)),
        intent=str(r.get("intent") or ""), period=period, quantity=quantity)


# --- rendering ------------------------------------------------------------------------------------

def render_request(chunker, r) -> list[Chunk]:
    drug, concept, med_ref = medication_of(r, chunker.resolve)
    codes, extra = code_keys(concept), [med_ref] if med_ref else []
    when = day(clinical_date(r))
    status = r.get("status", "")
    supply = (r.get("dispenseRequest") or {})
    duration = quantity_text(supply.get("expectedSupplyDuration"))
    validity = supply.get("validityPeriod") or {}
    reason = chunker.reason_text(r)
    visit, visit_ref = ("", "") if reason else ordering_visit(r, chunker.resolve)
    notes = _join((n.get("text", "") for n in r.get("note") or []), " ")
    text = _sentence(
        f"Medication order ({status}) {('on ' + when) if when else ''}:".replace("  ", " "),
        f"{drug}.",
        f"Dosage: {chunker.dosage_text(r.get('dosageInstruction'))}." if r.get("dosageInstruction") else "",
        f"Reason: {reason}." if reason else visit,
        f"Supply duration {duration}." if duration else "",
        f"Valid {period_text(validity)}." if period_text(validity) else "",
        f"Intent: {r.get('intent', '')}." if r.get("intent") else "",
        f"Note: {notes}" if notes else "",
    )
    label = make_label(when, "Med", f"{drug} ({status})" if status else drug)
    return [chunker.new_chunk(r, "0", text, label, "medication", category=status, codes=codes,
                              refs=extra + chunker.reason_refs(r) + ([visit_ref] if visit_ref else []), status=status)]


def ordering_visit(r: dict, resolve: Resolver) -> tuple[str, str]:
    reasons, when, enc_ref = visit_reasons(r, resolve)
    if not reasons:
        return "", ""
    return f"Ordered at the visit of {when} for {_join(reasons)}.", enc_ref


def render_administration(chunker, r) -> list[Chunk]:
    drug, concept, med_ref = medication_of(r, chunker.resolve)
    codes, extra = code_keys(concept), [med_ref] if med_ref else []
    when = day(clinical_date(r))
    dosage = r.get("dosage") or {}
    bits = [dosage.get("text", ""), quantity_text(dosage.get("dose"))]
    rate = dose_of(dosage).rate if isinstance(dosage, dict) else ""
    if rate:
        bits.append(f"rate {rate}")
    if dosage.get("route"):
        bits.append(f"route {concept_text(dosage['route'])}")
    reason = chunker.reason_text(r)
    request = ref_id(r.get("request"))
    text = _sentence(
        f"Medication administered ({r.get('status', '')}) on {when}:", f"{drug}.",
        f"Dose: {_join(bits, '; ')}." if any(bits) else "",
        f"Reason: {reason}." if reason else "",
    )
    refs = extra + chunker.reason_refs(r) + ([request] if request in chunker.by_ref else [])
    return [chunker.new_chunk(r, "0", text, make_label(when, "Given", drug), "medication",
                              category="administration", codes=codes, refs=refs, status=r.get("status", ""))]


def render_statement(chunker, r) -> list[Chunk]:
    drug, concept, med_ref = medication_of(r, chunker.resolve)
    codes, extra = code_keys(concept), [med_ref] if med_ref else []
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


def order_dosages(r: dict, resolve: Resolver) -> tuple[list, dict | None]:
    """A dispense's dosage when it records none: its order's (what it was dispensed for)."""
    for reference in r.get("authorizingPrescription") or []:
        order = resolve(ref_id(reference))
        if order and isinstance(order.get("dosageInstruction"), list) and order["dosageInstruction"]:
            return order["dosageInstruction"], order
    return [], None


def render_dispense(chunker, r) -> list[Chunk]:
    drug, concept, med_ref = medication_of(r, chunker.resolve)
    codes, extra = code_keys(concept), [med_ref] if med_ref else []
    status = r.get("status", "")
    when = day(clinical_date(r))
    orders = [ref_id(x) for x in r.get("authorizingPrescription") or [] if ref_id(x) in chunker.by_ref]
    ordered, order = ([], None) if r.get("dosageInstruction") else order_dosages(r, chunker.resolve)
    text = _sentence(
        f"Medication dispensed ({status})" + (f" on {when}:" if when else ":"), f"{drug}.",
        f"Quantity {quantity_text(r.get('quantity'))}." if quantity_text(r.get("quantity")) else "",
        f"Days supply {quantity_text(r.get('daysSupply'))}." if quantity_text(r.get("daysSupply")) else "",
        f"Dosage: {chunker.dosage_text(r.get('dosageInstruction'))}." if r.get("dosageInstruction") else
        f"Dosage (from the order of {day(clinical_date(order))}): {chunker.dosage_text(ordered)}." if ordered else "",
        f"Type: {concept_text(r.get('type'))}." if concept_text(r.get("type")) else "",
        chunker.notes_text(r),
    )
    return [chunker.new_chunk(r, "0", text, make_label(when, "Dispensed", drug), "medication", category="dispense",
                              codes=codes, refs=extra + orders, status=status)]


def dosages_text(dosages) -> str:
    return _join((dosage_text(d) for d in dosages or [] if isinstance(d, dict)), " | ")


KINDS = [
    Kind("MedicationRequest", "medications", ("authoredOn",), render_request, medication_fact, essential=True,
         title="medicationCodeableConcept"),
    Kind("MedicationAdministration", "medications", ("effectiveDateTime", "effectivePeriod"), render_administration,
         medication_fact, title="medicationCodeableConcept"),
    Kind("MedicationStatement", "medications", ("effectiveDateTime", "effectivePeriod", "dateAsserted"),
         render_statement, medication_fact, title="medicationCodeableConcept"),
    Kind("MedicationDispense", "medications", ("whenHandedOver", "whenPrepared"), render_dispense, medication_fact,
         title="medicationCodeableConcept"),
    Kind("Medication", "medications", search=None, essential=True, title="code"),
]
