"""The ``jupyter portable`` command."""
