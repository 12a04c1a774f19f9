"""The two failures a lab can report, each with its exit code: 2 for bad usage, 3 for a measurement that cannot run."""


class UsageError(Exception):
    """Bad usage or input: the CLI prints one line on stderr and exits 2."""

    exit_code = 2


class MeasurementError(Exception):
    """The measurement could not run at all: the CLI prints one line and exits 3."""

    exit_code = 3
