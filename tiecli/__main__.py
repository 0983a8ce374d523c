# python -m tiecli --help
from tiecli.cli import app

app()
