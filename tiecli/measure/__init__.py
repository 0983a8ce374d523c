"""The measure layer: the token matrices' geometry, gradient interference, the cancelled fraction, count-model
baselines, the loss on a split. Imports only from the layers below it, model and lower (tests/test_layers.py)."""
