"""Grids of runs and where they run: local processes, Ray, or Slurm through submitit.

``grid`` turns a grid file into cells (config-hashed runs), ``cell`` is the body of every job
(prepare the shared caches; run, resume or skip one cell), ``launchers`` submits, lists and
cancels. ``vapo-lab sweep`` / ``ablate --table1`` / ``jobs`` / ``cancel`` are their CLI.
"""
