"""Tools above the labs: `gpucheck` (every lab on a GPU, in one go), `report` (the HTML page of
saved runs) and `readme` (the README's claims table from the reference runs)."""
