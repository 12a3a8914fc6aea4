from protospec.bench.cli import main
from protospec.command_line import run_command

run_command(main)
