"""The model layer: the GPT with its tying modes, the sampling cache, the initialisation, the fused head,
checkpoint files. Imports only from the layers below it, runtime and lower (tests/test_layers.py)."""
