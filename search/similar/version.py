"""The version of the similarity profile's shape. A profile of an earlier version is read as it was
built; `chartcite check` warns of it and `check --repair` rebuilds it from the indexed record.

1: the first; 2: lab_states; 3: each problem's SNOMED semantic tag; 4: one unit a measure
(measure_units.tsv), and the readings that could not be converted counted.
"""
PROFILE_VERSION = 4
