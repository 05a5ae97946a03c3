"""The ``memoryctl`` command: argument parsing, output and exit codes over ``MemoryClient``."""
