"""``python -m topology.cli`` — the same command as the ``flywheel`` script.

``just demo`` and ``just validate`` use it."""

from topology.cli import main

main()
