import sys

from poot.cli import main

sys.exit(main())
