"""Stands in for rfc3987-syntax in the tests' processes (tests/conftest.py says why): jsonschema imports it in a
``suppress(ImportError)`` block, so refusing here leaves only its IRI format checks out."""

raise ImportError("rfc3987-syntax is left out of the tests' processes: it builds its parsers at import")
