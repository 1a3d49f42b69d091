"""Reading clinical text: the annotation pipeline (spaCy, scispaCy, negation), the shipped lexicon and abbreviations."""
