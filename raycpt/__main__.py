import sys

from raycpt.cli import main

sys.exit(main())
