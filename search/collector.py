"""Python's cyclic garbage collector, set for what chartcite allocates.

Reading FHIR JSON, validating it and annotating notes allocate millions of dicts, lists, models
and spaCy objects, almost none of them in reference cycles. By default the collector runs every
700 new container objects and, as they survive, walks all the older ones again: a fifth of the
CPU that indexing spends outside the embedding model, and half of reading a bundle with orjson
(measured on the 60 shared patients: 13.2 → 10.7 CPU-s; reading 2.2 → 1.4 s, while the model
waits). Collecting every 50,000 still frees young cycles within moments, and a question is as
fast as before (bench/ask.py, alternated with and without).
"""
from __future__ import annotations

import gc

YOUNG_OBJECTS_PER_COLLECTION = 50_000


def collect_less_often() -> None:
    """For the whole process: each entry point (the command line, the app factory) calls it."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(YOUNG_OBJECTS_PER_COLLECTION, young), middle, old)
