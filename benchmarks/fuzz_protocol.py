"""Long run of the wire-protocol fuzzer (tests/test_protocol_fuzz.py): many more hypothesis examples, not
derandomised, against a real gateway. Usage: python benchmarks/fuzz_protocol.py --examples 5000"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=5000, help="hypothesis examples per property")
    args = parser.parse_args()
    env = {**os.environ, "DPSQL_FUZZ_EXAMPLES": str(args.examples)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_protocol_fuzz.py", "--hypothesis-show-statistics"], cwd=ROOT, env=env)
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
