"""The record stage (`--collectives`): `recorder.py` evaluates the program so that every collective
also hands out small previews (`previews.py`) at the sites found in its jaxpr (`sites.py`);
`cards.py` turns the records into the cards the collectives view draws, `movement.py` says what
moved where, and `cell_recording.py` labels a cell's recording with the cell's own names."""
