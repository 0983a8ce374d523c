# python -m tiecli --help
from tiecli.cli import app

# Guarded: tokenizer worker processes (forkserver/spawn) import the main module again, as __mp_main__.
if __name__ == "__main__":
    app()
