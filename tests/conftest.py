"""The tests' fixtures and hooks live in tests/support/ (docs/testing.md says which does what);
this root conftest only loads them. The order matters where two define a fixture of one name:
a later plugin's wins (support.fixtures' `node_config` over support.realnode's default)."""

pytest_plugins = [
    "tests.support.harness.fixtures",
    "tests.support.realcluster",
    "tests.support.realnode",
    "tests.support.fixtures",
    "tests.support.webhook",
    "tests.support.tiers",
]
