import sys

from desktop.guest.daemon import main

sys.exit(main())
