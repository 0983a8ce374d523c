# python -m tiecli --help   (torchrun starts each rank as `python -m tiecli train ...`)
from tiecli.cli import app
from tiecli.runtime import launcher

# Guarded: tokenizer worker processes (forkserver/spawn) import the main module again, as __mp_main__.
if __name__ == "__main__":
    if launcher.launched():
        launcher.run_rank(app)
    app()
