"""The commands layer, beside sweep/ and report/: start or resume a run, sample, export, measure a
pretrained model. Imports from its own layer and the ones below it, never the command line's (tests/test_layers.py)."""
