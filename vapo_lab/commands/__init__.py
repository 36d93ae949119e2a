"""The command layer: one thin module per CLI noun (parse, compose, call the library, print)."""
