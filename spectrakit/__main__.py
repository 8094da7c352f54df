import sys

from spectrakit.commands.entry import main  # (first: the signal handlers, before any heavy import)

sys.exit(main())
