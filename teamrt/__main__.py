import sys

from teamrt.cli.main import main

sys.exit(main())
