import sys

from defl_cli.main import main

sys.exit(main())
