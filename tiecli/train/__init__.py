"""The train layer: the optimizer, what the loop works with, the run's state, the loop, TensorBoard and W&B.
Imports only from the layers below it, measure and lower (tests/test_layers.py)."""
