"""The test suite: every test file sits in the folder whose rule (its __init__.py docstring) says it belongs there; this level keeps only conftest.py and helpers shared by several folders."""
