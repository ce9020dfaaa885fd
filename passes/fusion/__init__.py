"""The passes on fusions, before any buffer exists: `insert-reshardings` (a set wherever an
operand must move to where its op computes) and `auto-stream-parallel` (the stream axes of
a fusion written without any)."""
