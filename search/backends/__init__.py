"""Indexes behind one contract (`base.Backend`): SQLite FTS5 + vectors embedded in one file, or Elasticsearch."""
