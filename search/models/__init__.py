"""The models chartcite loads from local files: the embedder, the optional cross-encoder and the optional LLM client."""
