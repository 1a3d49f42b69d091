"""Optional cross-encoder rerank: a sentence-transformers CrossEncoder loaded from a local folder.

It reads the question and each candidate together, which catches paraphrase the features miss.
It does not replace the deterministic features: a general-domain cross-encoder has no idea that
"No Known Allergies." denies the allergy asked about, so its score is one more feature beside
negation, dates and recency (see pipeline.rerank).
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

from search.models.embed import pytorch_missing, quiet_model_libraries


class RerankerNotFound(RuntimeError):
    pass


class CrossEncoderRanker:
    # Only the best candidates by the deterministic features are read: the cross-encoder costs a
    # forward pass per pair and the tail never reaches the top k.
    max_pairs = 30

    def __init__(self, model_path: str):
        quiet_model_libraries()
        if not (Path(model_path) / "config.json").exists():
            raise RerankerNotFound(f"no cross-encoder model in {model_path} (CHARTCITE_RERANKER)")
        try:
            import torch
            from sentence_transformers import CrossEncoder
        except ImportError as exc:
            raise RerankerNotFound(pytorch_missing("a cross-encoder reranker (CHARTCITE_RERANKER)")) from exc

        self.path = model_path
        self.name = Path(model_path).name
        self._identity = torch.nn.Identity()
        self.model = CrossEncoder(model_path, device="cpu", local_files_only=True)

    def scores(self, question: str, texts: list[str]) -> list[float]:
        """Relevance in 0..1 for each text (a logistic of the model's logit)."""
        if not texts:
            return []
        logits = self.model.predict([(question, t) for t in texts], show_progress_bar=False,
                                    convert_to_numpy=True, activation_fn=self._identity)
        return [1.0 / (1.0 + math.exp(-float(x))) for x in logits.reshape(len(texts), -1)[:, 0]]


@lru_cache(maxsize=2)
def load_reranker(model_path: str) -> CrossEncoderRanker:
    return CrossEncoderRanker(model_path)
