"""Patients like this one: a profile per indexed patient, similar patients, cohort comparisons.

Everything here reads one tenant's profiles through the backend (the tenant is inside every
query) and returns de-identified results only: age bands, offsets instead of dates, opaque
handles valid for one response.
"""
