"""A question's walk through the record: analysis, time anchoring, and the staged hybrid pipeline."""
