"""From evidence to what the clinician reads: extractive answers, verified LLM answers, drafts, charts, identifier scrubbing."""
