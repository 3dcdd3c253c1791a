"""Releasing a model: the promotion gate (gate), the model card (card) and the provenance tags (lineage)."""
