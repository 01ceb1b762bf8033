import sys

from grlib.cli import main

sys.exit(main())
