"""The EHR connection: registrations, keys, client authentication, discovery and tokens, the FHIR
client with paging, `Binary` and Bulk Data, the request budget, the patient fetch and write-back."""
