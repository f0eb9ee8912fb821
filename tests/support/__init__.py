"""Helpers shared by the test areas, imported as support.<name>.

tests/ is on sys.path because conftest.py lives there (pytest prepend import mode).
"""
