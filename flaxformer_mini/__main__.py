import sys

from flaxformer_mini.cli import main

sys.exit(main())
