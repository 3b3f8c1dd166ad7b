"""`python -m bench.reproduce TARGET`: re-run one table or claim of a source paper through the
emulator (a sweep over seeds) and write a Markdown report: paper value | ours | difference."""
