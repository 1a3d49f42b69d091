"""The record: reading FHIR files, checking and staging resources, assembling each patient's
record, the kinds of resource (what each type means and how it is rendered) and the chunks."""
