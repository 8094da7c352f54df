"""The command layer: one module per ``spectrakit`` sub-command, each defining ``add_arguments(parser)`` and
``run(args) -> int`` (parse options, load files, call the library, print). :data:`spectrakit.cli.COMMANDS`
lists them. Library packages below only return data (e.g. :func:`spectrakit.linalg.report.rows_for`,
:func:`spectrakit.conv.lipschitz_report`); see docs/architecture.md.
"""
