"""The IPython face: the magics (`magics.py`, one method per magic, with the `@argument`s that
`%%pmap?` prints; `cluster_magic.py` for `%cluster`), the line read into an options record
(`lines.py`), the record turned into an outcome to show and bind (`actions.py`), and a magic run on
every process of a cluster (`remote.py` in the kernel, `process_magic.py` in each process).
Everything below works without IPython."""
