"""Series for the frame's small trend chart, read from the observations a trend chunk cites."""
from __future__ import annotations

from fhir_ingest.chunk import blood_pressure, clinical_date
from fhir_ingest.contract import Chunk
from fhir_ingest.normalize import concept_text

from search.backends.base import Backend


def observation_values(resource: dict) -> tuple[list[float], str] | None:
    bp = blood_pressure(resource)
    if bp:
        sys_q, dia_q = (component.get("valueQuantity") or {} for component in bp)
        if sys_q.get("value") is not None and dia_q.get("value") is not None:
            return [float(sys_q["value"]), float(dia_q["value"])], sys_q.get("unit", "mm[Hg]")
    q = resource.get("valueQuantity") or {}
    if q.get("value") is not None:
        return [float(q["value"])], q.get("unit", "")
    return None


def trend_chart(backend: Backend, chunk: Chunk) -> dict | None:
    points, unit, title = [], "", ""
    for ref in chunk.refs:
        resource = backend.get_resource(chunk.tenant, chunk.patient_id, ref)
        if not resource:
            continue
        parsed = observation_values(resource)
        if parsed is None:
            continue
        values, unit = parsed
        title = title or concept_text(resource.get("code"))
        points.append({"date": clinical_date(resource)[:10], "values": values, "ref": ref})
    points.sort(key=lambda p: p["date"])
    if len(points) < 2 or len({len(p["values"]) for p in points}) != 1:
        return None
    return {"title": title, "unit": unit, "points": points}


def series_chart(series) -> dict | None:
    """A chart a clinician can read: dates on x, values with the unit on y, each point's value,
    the reference range as a band when the record gives one, systolic and diastolic together."""
    points = [{"date": p.date, "values": p.values, "ref": p.ref, "text": p.text} for p, _ in series.points]
    if len(points) < 2 or len({len(p["values"]) for p in points}) != 1:
        return None
    unit = series.points[-1][0].unit
    names = ["systolic", "diastolic"] if len(points[0]["values"]) == 2 else [series.name]
    low, high = series.range or (None, None)
    return {"title": series.name, "full_title": series.coded or series.name, "unit": unit, "points": points,
            "series": names, "range": {"low": low, "high": high} if series.range else None}
