"""The registry of kinds: every FHIR resource type chartcite reads, one module per family, and the
lists everything else is derived from (what is indexed, what is read only to complete other
records, what is deliberately ignored and why, what an EHR is searched for and with which
parameter, which types a first sync embeds first). Adding a resource type is one Kind in its
family's module and its tests.
"""
from __future__ import annotations

from . import administrative, care, documents, encounters, history, medications, observations, problems, procedures
from .base import KINDS, Kind, Resolver, clinical_date, kind_of

FAMILIES = (encounters, medications, observations, problems, procedures, documents, care, history, administrative)
for _family in FAMILIES:
    for _kind in _family.KINDS:
        KINDS[_kind.resource_type] = _kind

# Resources chartcite turns into chunks, and the ones it reads only to resolve references.
INDEXED_TYPES = frozenset(rt for rt, k in KINDS.items() if k.indexed)
SUPPORT_TYPES = frozenset(rt for rt, k in KINDS.items() if not k.indexed)
# Indexed, but about whom the record is rather than what happened: a Patient alone is no record.
CLINICAL_TYPES = INDEXED_TYPES - {"Patient"}
# What an EHR is searched for, by the parameter naming the patient (its FHIR R4 search parameter).
PATIENT_SEARCHES = {rt: k.search for rt, k in KINDS.items() if k.search}
# Read through references (Patient/<id>, a drug's Medication, a note's Binary), never searched.
REFERENCED_TYPES = tuple(rt for rt, k in KINDS.items() if not k.search)
# The problem list, medications and allergies: a first sync embeds them first, so the clinician
# can ask about them by meaning while results, notes and visits are still embedding.
ESSENTIAL_TYPES = frozenset(rt for rt, k in KINDS.items() if k.essential)

# Read, counted and deliberately not indexed, with the reason the index report gives.
IGNORED_TYPES = {
    "Claim": "billing", "ExplanationOfBenefit": "billing", "ClaimResponse": "billing", "Account": "billing",
    "Invoice": "billing", "ChargeItem": "billing",
    "Provenance": "record-keeping about other records", "AuditEvent": "record-keeping about other records",
    "Practitioner": "directory data (names appear through references)",
    "PractitionerRole": "directory data (names appear through references)",
    "Organization": "directory data (names appear through references)",
    "Location": "directory data (names appear through references)", "Endpoint": "directory data",
    "HealthcareService": "directory data", "RelatedPerson": "contact data, not clinical content",
    "Person": "contact data, not clinical content", "Group": "lists of patients",
    "Questionnaire": "a form definition; the answers are indexed", "Library": "knowledge artefact",
    "ValueSet": "terminology", "CodeSystem": "terminology", "ConceptMap": "terminology",
    "StructureDefinition": "conformance", "CapabilityStatement": "conformance", "OperationOutcome": "server message",
    "SupplyDelivery": "logistics", "SupplyRequest": "logistics", "Schedule": "scheduling", "Slot": "scheduling",
    "Appointment": "scheduling", "Task": "workflow", "Communication": "messaging", "Consent": "consent records",
    "List": "a list of other records (each indexed on its own)", "Bundle": "a container (its entries are read)",
}


def fact_of(resource: dict, resolve: Resolver):
    """The typed fact a resource states, by its kind; None for a kind that states none."""
    kind = KINDS.get(resource.get("resourceType"))
    return kind.fact(resource, resolve) if kind is not None and kind.fact is not None else None


__all__ = ["KINDS", "Kind", "Resolver", "clinical_date", "kind_of", "fact_of", "INDEXED_TYPES", "SUPPORT_TYPES", "CLINICAL_TYPES",
           "PATIENT_SEARCHES", "REFERENCED_TYPES", "ESSENTIAL_TYPES", "IGNORED_TYPES", "FAMILIES"]
