import sys

from raycpt.entry import main

sys.exit(main())
