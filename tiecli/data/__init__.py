"""The data layer: where documents come from, the tokenizers, the split and the cached tokens, the batches,
related word forms. Imports only from the base, storage and config below it (tests/test_layers.py)."""
