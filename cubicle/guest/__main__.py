import sys

from cubicle.guest.daemon import main

sys.exit(main())
