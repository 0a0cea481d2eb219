"""pytest's entry for every tier (tests/, bench/tests, producers/python/tests): the shared
fixtures and the tier markers live in tests/support."""

pytest_plugins = ["tests.support.fixtures", "tests.support.tiers"]
