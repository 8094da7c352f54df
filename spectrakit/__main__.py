import sys

from spectrakit.cli import main

sys.exit(main())
