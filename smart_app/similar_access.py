"""Whether similar patients and cohort comparisons may be used for a tenant: opt-in twice, for the
deployment (CHARTCITE_SIMILAR_PATIENTS=on) and, for an EHR's tenant, per registration."""
from __future__ import annotations

DEPLOYMENT_OFF = ("Similar patients and cohort comparisons are off for this deployment: hospital IT turns them on "
                  "with CHARTCITE_SIMILAR_PATIENTS=on.")


def refusal(settings, registry, tenant: str) -> str:
    """The sentence saying why it is off and how to turn it on; "" when it is on."""
    if not settings.similar_patients:
        return DEPLOYMENT_OFF
    ehr = registry.ehr(tenant) if registry is not None else None
    if ehr is not None and not ehr.similar_patients:
        return (f"Similar patients and cohort comparisons are off for the EHR {tenant}: hospital IT turns them on "
                f"with `chartcite ehr update {tenant} --similar-patients on`.")
    return ""
