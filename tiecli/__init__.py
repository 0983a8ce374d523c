"""tiecli: does sharing the input embedding with the output matrix help a language model?"""

__version__ = "0.2.0"
