"""python -m grlib.probes.device_check [OUT]: the check (grlib.probes.device_check.check.main)."""
import sys

from grlib.probes.device_check.check import main

sys.exit(main())
