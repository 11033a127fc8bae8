"""`defl`, the command-line client of a DeFL node (installed by the project's package)."""
