"""``python -m memoryctl``: the CLI, for environments without the console script on PATH."""

from memoryctl.cli.main import run

run()
