"""The runtime layer: device, precision, threads and compile; ranks and the process group. Imports only
from the layers below it, data and lower (tests/test_layers.py)."""
