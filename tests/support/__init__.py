"""What tests and benchmarks share: fake servers and cache, data builders, workspace and loop helpers.
Test modules import from here only, never from one another (tests/test_test_imports.py checks)."""
