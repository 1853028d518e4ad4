"""Where the tests find the repository and their data, from any tier's folder."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# Facts and files from outside the project that tests of several tiers read (tests/fixtures/).
FIXTURES = ROOT / "tests" / "fixtures"
# What `kata-sizing render` prints for the examples (the unit tier's golden test, the image's render).
GOLDEN = ROOT / "tests" / "golden"
SUPPORT = Path(__file__).resolve().parent
