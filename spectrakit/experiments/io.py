"""Result tables for experiments: the helpers of :mod:`spectrakit._tables` (markdown rendering, the
environment header, saving ``results.json``/``results.md``), re-exported under the name experiments use."""

from spectrakit._tables import environment, invocation, markdown_table, report, table_row

__all__ = ["environment", "invocation", "markdown_table", "report", "table_row"]
