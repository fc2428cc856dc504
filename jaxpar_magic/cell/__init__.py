"""What a cell is: its analysis (`analysis.py`: what it reads, writes and returns), its inputs (any
pytree, `inputs.py`), fingerprints of what it reads as constants, the `PreparedCell` an engine hands
to every stage, the compiled cell and its cache (`programs.py`), and the specs, meshes, layouts and
compiled-HLO facts they are described by. Imports nothing else of the package but `errors`."""
