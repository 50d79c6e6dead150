import sys

from flaxformer_mini.cli.main import main

sys.exit(main())
