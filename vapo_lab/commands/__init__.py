"""The command layer: one thin module per CLI noun (parse, compose, call one library function,
print)."""
