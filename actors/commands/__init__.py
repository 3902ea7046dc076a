"""The application's commands: ``flywheel replay``, ``promote``, ``rollback``, ``review``, ``sandbox``, ``verify`` and
the live view of ``flywheel up``. They register into the framework's CLI (see `actors._app`) and use the libraries and
`actors.protocol`, never an actor kind.
"""

__all__: list[str] = []
